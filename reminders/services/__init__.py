"""Writes to reminders, one module per stage of a reminder's life.

Each status change is a guarded UPDATE whose ``WHERE`` names the statuses it may leave; the rows
it changed say which of two racing callers won. These modules never import the Celery tasks.
"""

from reminders.services import reasons
from reminders.services.claim import reminder_claim_batch
from reminders.services.dispatch import (
    dispatches_prune,
    reminders_dispatch,
    reminders_unpublished,
    replays_resume,
    scan_completed,
    sessions_prune,
)
from reminders.services.fate import reminder_fate, reminders_return, sources_locked
from reminders.services.plan import (
    reminders_follow_enrollment,
    reminders_follow_workshop,
    reminders_plan,
    reminders_plan_enrollments,
)
from reminders.services.reap import reminders_reap
from reminders.services.record import (
    reminder_record_batch,
    reminder_release,
    reminder_release_interrupted,
    reminder_verdict,
)
from reminders.services.settle import reminders_settle

__all__ = [
    "dispatches_prune",
    "reasons",
    "reminder_claim_batch",
    "reminder_fate",
    "reminder_record_batch",
    "reminder_release",
    "reminder_release_interrupted",
    "reminder_verdict",
    "reminders_dispatch",
    "reminders_follow_enrollment",
    "reminders_follow_workshop",
    "reminders_plan",
    "reminders_plan_enrollments",
    "reminders_reap",
    "reminders_settle",
    "reminders_return",
    "reminders_unpublished",
    "replays_resume",
    "scan_completed",
    "sessions_prune",
    "sources_locked",
]
