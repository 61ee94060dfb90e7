"""The claim watch: re-read a batch's claimed rows while it runs, and withdraw what changed."""

from __future__ import annotations

import logging

from django.db import InterfaceError, OperationalError, connection

from clock import Clock
from delivery.gate import Gate
from reminders.models import Notice, Reminder
from reminders.services._sql import claim_token_param, one_of, rows_cte
from workshops.models import Enrollment, Workshop

# No call starts over this many seconds after staff commit a cancel or move (snapshot max age).
REVOCATION_WINDOW = 1.0
# How often the claim watch re-reads the claimed rows while a batch runs.
WATCH_INTERVAL = 0.25

logger = logging.getLogger(__name__)


class _Watch:
    """Re-read a claim's rows between engine turns; publish to ``gate`` what is withdrawn."""

    def __init__(self, *, token, clock: Clock) -> None:
        self._token = token
        self._clock = clock
        self.gate = Gate(max_age=REVOCATION_WINDOW, clock=clock)

    def seed(self, read_at: float) -> None:
        """Take the claim's own read, begun at ``read_at`` (monotonic), as the first snapshot."""
        self.gate.publish({}, taken_at=read_at)

    def refresh(self) -> None:
        """Read the rows once and publish withdrawals; a database error leaves the gate stale."""
        taken_at = self._clock.monotonic()
        try:
            withdrawn = self._withdrawn()
        except (OperationalError, InterfaceError) as exc:
            # No fresh snapshot: calls wait for one rather than guess.
            logger.warning("%s could not read the database: %s", type(self).__name__, exc)
            connection.close()
            return
        self.gate.publish(withdrawn, taken_at=taken_at)

    def _withdrawn(self) -> dict[int, str]:
        raise NotImplementedError


class ClaimWatch(_Watch):
    """Re-read a claim's rows between engine turns, and tell the engine's gate what changed.

    An envelope is withdrawn once its reminder is not ``sending`` under this claim, its
    workshop or enrollment is off, or what it shows moved.
    """

    def __init__(self, *, token, reminders, clock: Clock) -> None:
        super().__init__(token=token, clock=clock)
        # What each claimed reminder's message showed of its workshop, once per workshop.
        self._workshop_of = {reminder.pk: reminder.workshop_id for reminder in reminders}
        self._shown = {}
        for reminder in reminders:
            if reminder.workshop_id not in self._shown:
                workshop = reminder.workshop
                self._shown[workshop.pk] = tuple(getattr(workshop, name) for name in _SHOWN)

    def _withdrawn(self) -> dict[int, str]:
        unchanged = self._unchanged()
        changed = [pk for pk in self._workshop_of if pk not in unchanged]
        return self._reasons(changed) if changed else {}

    def _unchanged(self) -> set[int]:
        """Return the ids still ``sending`` under this claim, live and as rendered."""
        quote = connection.ops.quote_name
        stamp = connection.ops.adapt_datetimefield_value
        # Each shown value by its column's type (a rendered tuple follows _SHOWN's order).
        shown_rows = [
            (workshop_id, *(
                stamp(value) if kind == "timestamptz" else value
                for kind, value in zip(_SHOWN.values(), shown, strict=True)
            ))
            for workshop_id, shown in self._shown.items()
        ]  # fmt: skip
        shown, params = rows_cte(connection, "shown", _SHOWN_COLUMNS, shown_rows)
        among, among_params = one_of(connection, "r.id", list(self._workshop_of))
        sql = (
            f"WITH {shown} "
            f"SELECT r.id FROM {quote(Reminder._meta.db_table)} r "
            f"JOIN {quote(Workshop._meta.db_table)} w ON w.id = r.workshop_id "
            f"JOIN {quote(Enrollment._meta.db_table)} e ON e.id = r.enrollment_id "
            "JOIN shown ON shown.id = w.id "
            f"WHERE {among} AND r.claim_token = %s AND w.status = %s AND e.status = %s AND "
            + " AND ".join(f"w.{name} = shown.{name}" for name in _SHOWN)
        )
        params += [*among_params, claim_token_param(self._token)]
        params += [Workshop.Status.SCHEDULED.value, Enrollment.Status.ACTIVE.value]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return {row[0] for row in cursor.fetchall()}

    def _reasons(self, ids: list[int]) -> dict[int, str]:
        """Return why each of ``ids`` is withdrawn."""
        rows = Reminder.objects.filter(pk__in=ids).values_list(
            "pk",
            "claim_token",
            "workshop__status",
            "enrollment__status",
            *(f"workshop__{name}" for name in _SHOWN),
        )
        withdrawn = dict.fromkeys(ids, "the reminder no longer exists")
        for pk, token, w_status, e_status, *shown in rows:
            if token != self._token:  # held only while sending
                withdrawn[pk] = "the claim was lost (lease expired)"
            elif w_status != Workshop.Status.SCHEDULED:
                withdrawn[pk] = "workshop cancelled"
            elif e_status != Enrollment.Status.ACTIVE:
                withdrawn[pk] = "enrollment cancelled"
            elif tuple(shown) != self._shown[self._workshop_of[pk]]:
                withdrawn[pk] = "workshop changed after the message was rendered"
            else:
                # Changed and changed back between the two reads: as rendered again.
                del withdrawn[pk]
        return withdrawn


class NoticeWatch(_Watch):
    """Withdraw the notices of a claim whose attendee was erased (they asked to hear nothing
    more). A change of the workshop withdraws none: the next revision's notice follows
    (docs/faults.md S11)."""

    def __init__(self, *, token, notices, clock: Clock) -> None:
        super().__init__(token=token, clock=clock)
        self._ids = [notice.pk for notice in notices]

    def _withdrawn(self) -> dict[int, str]:
        rows = Notice.objects.filter(pk__in=self._ids).values_list(
            "pk", "claim_token", "attendee__erased_at"
        )
        lost = "the claim was lost (lease expired)"
        return {
            pk: "the attendee was erased" if token == self._token else lost
            for pk, token, erased_at in rows
            if token != self._token or erased_at is not None
        }


# What a message shows of its workshop, with the PostgreSQL types: a change to any of it
# withdraws unsent calls.
_SHOWN = {
    "title": "text",
    "starts_at": "timestamptz",
    "ends_at": "timestamptz",
    "timezone": "text",
    "location": "text",
    "join_url": "text",
    "contact_name": "text",
    "contact_email": "text",
}
_SHOWN_COLUMNS = {"id": "bigint", **_SHOWN}
