"""The claim: one guarded UPDATE makes one worker the single owner of the reminders it may send."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, models, transaction
from django.db.models import Case, F, Q, QuerySet, Value, When

from clock import Clock, default_clock
from reminders.content import choose_text, reminder_language
from reminders.models import DeliveryAttempt, MessageText, Reminder
from reminders.policy import ReminderPolicy
from reminders.services import reasons
from reminders.services._sql import claim_token_param
from workshops.models import Enrollment, Workshop, WorkshopText

Status = Reminder.Status


def _scheduled_workshops() -> QuerySet:
    return Workshop.objects.filter(status=Workshop.Status.SCHEDULED).values("id")


def _active_enrollments() -> QuerySet:
    return Enrollment.objects.filter(status=Enrollment.Status.ACTIVE).values("id")


@dataclass(frozen=True, slots=True)
class Claim:
    """What one worker now owns: reminders fenced by ``token`` until ``lease_expires_at``."""

    token: uuid.UUID
    lease_expires_at: datetime
    channel: str
    reminders: list[Reminder]
    # The DeliveryAttempt number of this claim, per reminder id (logs carry it).
    attempt_numbers: dict[int, int] = field(default_factory=dict)

    @property
    def ids(self) -> list[int]:
        return [reminder.pk for reminder in self.reminders]


def reminder_claim_batch(
    *,
    ids: list[int],
    channel: str,
    worker: str = "",
    lease_seconds: int | None = None,
    clock: Clock | None = None,
) -> Claim:
    """Make the calling worker the single owner of those of ``ids`` that may be sent now.

    One guarded UPDATE (status, deadline, window and retry time in its WHERE)
    takes the rows: under PostgreSQL's READ COMMITTED, a concurrent claimer
    blocks on the row lock, then re-evaluates the WHERE against the committed
    row, sees ``status = 'sending'`` and changes nothing. Exactly one claimer
    wins each row. This is also the one place the deadline is *enforced*:
    ids refused for lateness become ``missed`` here. The claim, its lease,
    each first-claimed reminder's frozen text and a DeliveryAttempt per
    reminder commit before any provider is called.
    """
    clock = clock or default_clock()
    now = clock.now()
    lease = now + timedelta(seconds=lease_seconds or settings.REMINDERS_LEASE_SECONDS)
    token = uuid.uuid4()
    with transaction.atomic():
        Reminder.objects.filter(
            ReminderPolicy.on_time_q(now),
            Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now),
            id__in=ids,
            status__in=Reminder.OPEN_STATUSES,
            window_opens_at__lte=now,
            workshop_id__in=_scheduled_workshops(),
            enrollment_id__in=_active_enrollments(),
        ).update(
            status=Status.SENDING,
            claim_token=token,
            lease_expires_at=lease,
            attempts=F("attempts") + 1,
            channel=channel,
            queued_until=None,
            next_attempt_at=None,
            updated_at=now,
        )
        Reminder.objects.filter(
            ReminderPolicy.late_q(now), id__in=ids, status__in=Reminder.OPEN_STATUSES
        ).update(
            status=Status.MISSED,
            status_reason=reasons.LATE_AT_CLAIM,
            queued_until=None,
            next_attempt_at=None,
            updated_at=now,
        )
        claimed = list(
            Reminder.objects.filter(claim_token=token, status=Status.SENDING)
            .select_related("attendee", "workshop", "text")
            .order_by("deadline_at", "id")
        )
        _freeze_texts([reminder for reminder in claimed if reminder.text_id is None])
        numbers = _record_attempts(token=token, worker=worker)
    return Claim(
        token=token,
        lease_expires_at=lease,
        channel=channel,
        reminders=claimed,
        attempt_numbers=numbers,
    )


def _freeze_texts(reminders: list[Reminder]) -> None:
    """Fix the language and text of reminders claimed for the first time.

    Two statements when the texts are stored already (find them, point the
    reminders at them); two more for the first batch of a new text (insert
    it, read its id back); one more to read the workshops' texts in other
    languages when an attendee's language differs from their workshop's.

    Each gets the text ``reminders.content.choose_text`` picks from its
    workshop and attendee as they are now; the rows are shared by content,
    so the insert usually finds them there already. The UPDATE keeps any
    text a row already has. From here on every send of these reminders, on
    any retry, requeue, reap or replay, renders from that row.
    """
    if not reminders:
        return
    # A text in another language matters only to attendees whose language is
    # not their workshop's: most batches need no read of them at all.
    texts: dict[int, dict[str, WorkshopText]] = {}
    others = {
        reminder.workshop_id
        for reminder in reminders
        if reminder_language(workshop=reminder.workshop, attendee=reminder.attendee)
        != reminder.workshop.language
    }
    for text in WorkshopText.objects.filter(workshop_id__in=others) if others else ():
        texts.setdefault(text.workshop_id, {})[text.language] = text
    chosen = {
        reminder.pk: choose_text(
            workshop=reminder.workshop,
            attendee=reminder.attendee,
            texts=texts.get(reminder.workshop_id, {}),
        )
        for reminder in reminders
    }
    rows = {row.digest: row for row in chosen.values()}
    ids = dict(MessageText.objects.filter(digest__in=rows).values_list("digest", "pk"))
    missing = [rows[digest] for digest in sorted(rows) if digest not in ids]
    if missing:
        # Only the first batch of a new text writes. A claimer inserting the
        # same text at the same moment: one insert wins, the other does nothing
        # and reads the winner's row; no existing row is ever locked or rewritten.
        MessageText.objects.bulk_create(missing, ignore_conflicts=True)
        found = MessageText.objects.filter(digest__in=[row.digest for row in missing])
        ids.update(found.values_list("digest", "pk"))
    by_text: dict[int, list[int]] = {}
    for pk, row in chosen.items():
        by_text.setdefault(ids[row.digest], []).append(pk)
    Reminder.objects.filter(pk__in=chosen, text__isnull=True).update(
        text_id=Case(
            *(When(pk__in=pks, then=Value(text_id)) for text_id, pks in by_text.items()),
            output_field=models.BigIntegerField(),
        )
    )
    for reminder in reminders:
        row = rows[chosen[reminder.pk].digest]
        row.pk, row._state.adding = ids[row.digest], False
        reminder.text = row


def _record_attempts(*, token: uuid.UUID, worker: str) -> dict[int, int]:
    """Insert one in-flight DeliveryAttempt per reminder of the claim, in one statement.

    Each attempt is numbered after the reminder's highest earlier one, not by
    ``Reminder.attempts``: that counter goes down when a claim is refunded
    (released before any provider call, or replayed by staff), and the
    history must stay append-only and uniquely numbered.
    """
    attempt = connection.ops.quote_name(DeliveryAttempt._meta.db_table)
    reminder = connection.ops.quote_name(Reminder._meta.db_table)
    token_value = claim_token_param(token)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {attempt} (reminder_id, number, claim_token, channel, worker, "
            "claimed_at, lease_expires_at, finished_at, outcome, provider_calls, error, "
            "provider_message_id) "
            f"SELECT r.id, COALESCE((SELECT MAX(a.number) FROM {attempt} a "
            "WHERE a.reminder_id = r.id), 0) + 1, r.claim_token, r.channel, %s, "
            "r.updated_at, r.lease_expires_at, NULL, %s, 0, '', '' "
            f"FROM {reminder} r WHERE r.claim_token = %s AND r.status = %s "
            "RETURNING reminder_id, number",
            [
                worker[:200],
                DeliveryAttempt.Outcome.IN_FLIGHT.value,
                token_value,
                Status.SENDING.value,
            ],
        )
        return dict(cursor.fetchall())
