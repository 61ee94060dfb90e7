"""The one deadline rule: when a reminder's send window opens and when it closes.

Both are computed only here, in UTC (so daylight saving cannot shift them), from the workshop's
start as it is now: no row stores them. The claim enforces the rule (reminder_claim_batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache

from django.conf import settings
from django.db.models import Q


@dataclass(frozen=True, slots=True)
class ReminderPolicy:
    lead: timedelta
    cutoff: timedelta

    def __post_init__(self) -> None:
        if self.cutoff < timedelta(0):
            raise ValueError("cutoff must not be negative.")
        if self.lead <= self.cutoff:
            raise ValueError("lead must be longer than cutoff: the window opens before it closes.")

    @classmethod
    def from_settings(cls) -> ReminderPolicy:
        """Return the policy of REMINDERS_LEAD_MINUTES and REMINDERS_CUTOFF_MINUTES."""
        return _policy(cls, settings.REMINDERS_LEAD_MINUTES, settings.REMINDERS_CUTOFF_MINUTES)

    def window_opens_at(self, starts_at: datetime) -> datetime:
        """Return the first instant a reminder for a workshop starting then may be sent."""
        return _utc(starts_at) - self.lead

    @staticmethod
    def is_late(*, deadline_at: datetime, now: datetime) -> bool:
        """Return True once nothing may be sent: the deadline is the first late instant."""
        return deadline_at <= now

    # The rule on the workshop's start (deadline <= now is start <= now + cutoff),
    # read when the statement runs. ``through`` is the path to the workshop.

    def late_start_q(self, now: datetime, *, through: str = "") -> Q:
        """Return ``is_late`` as a filter on the workshop's start."""
        return Q(**{f"{through}starts_at__lte": now + self.cutoff})

    def open_start_q(self, now: datetime, *, through: str = "") -> Q:
        """Return "the window is open and the deadline ahead" as a filter on the start."""
        return Q(
            **{f"{through}starts_at__gt": now + self.cutoff},
            **{f"{through}starts_at__lte": now + self.lead},
        )

    def lead_start_q(self, now: datetime, *, through: str = "") -> Q:
        """Return "the start is within a lead either side of now": what plan and settle scan."""
        return Q(
            **{f"{through}starts_at__gt": now - self.lead},
            **{f"{through}starts_at__lte": now + self.lead},
        )

    def late_sql(self, column: str, now_plus) -> tuple[str, list]:
        """Return ``late_start_q`` as ``(sql, params)`` on ``column``, a workshop's start.

        ``now_plus(delta)`` gives ``(sql, params)`` of the statement's "now" plus ``delta``.
        """
        bound, params = now_plus(self.cutoff)
        return f"{column} <= {bound}", params

    def open_sql(self, column: str, now_plus) -> tuple[str, list]:
        """Return ``open_start_q`` as ``(sql, params)`` on ``column``, a workshop's start."""
        after, after_params = now_plus(self.cutoff)
        within, within_params = now_plus(self.lead)
        return f"{column} > {after} AND {column} <= {within}", after_params + within_params

    def deadline_at(self, starts_at: datetime) -> datetime:
        """Return the instant after which a reminder must not be sent (start minus cutoff)."""
        return _utc(starts_at) - self.cutoff


def _utc(moment: datetime) -> datetime:
    """Return ``moment`` in UTC, where subtraction counts elapsed time, not wall time."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("The deadline rule needs an aware datetime; got a naive one.")
    return moment.astimezone(UTC)


@lru_cache(maxsize=8)
def _policy(cls, lead_minutes: float, cutoff_minutes: float) -> ReminderPolicy:
    # Asked once per reminder rendered: built once per pair of settings.
    return cls(lead=timedelta(minutes=lead_minutes), cutoff=timedelta(minutes=cutoff_minutes))
