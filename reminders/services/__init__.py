"""Writes to reminders, one module per stage of a reminder's life.

- ``plan``: create rows; follow workshop and enrollment changes (cancel, move,
  re-enrol) inside their transactions.
- ``settle``: put unsent rows where their workshop and enrollment, as they are
  now, say (cancelled, missed, or pending again).
- ``dispatch``: queue due rows and publish them in batches after commit.
- ``claim``: one guarded UPDATE makes one worker the owner of a chunk.
- ``record``: write each outcome, or release what was never sent, fenced by
  the claim.
- ``reap``: resolve claims whose worker vanished.
- ``fate``: the one rule for a reminder handed back towards delivery, derived
  from its workshop and enrollment as they are now.

Each status change is a guarded, set-based UPDATE whose ``WHERE`` names the
statuses it may leave; the rows it reports changed say which caller won, so
two processes racing on the same reminder cannot both succeed. The only other
writer of ``Reminder.status`` is ``reminders.services.replay`` (staff decisions), which
uses the same fate and guards. These modules never import the Celery task
module or the publisher: the dispatcher is handed its ``publish`` function.
"""

from reminders.services import reasons
from reminders.services.claim import Claim, reminder_claim_batch
from reminders.services.dispatch import (
    SCAN_NAME,
    dispatches_prune,
    message_expiry,
    reminders_dispatch,
    reminders_unpublished,
    replays_resume,
    scan_completed,
)
from reminders.services.fate import Fate, Source, reminder_fate, reminders_return, sources_locked
from reminders.services.plan import (
    reminders_follow_enrollment,
    reminders_follow_workshop,
    reminders_plan,
)
from reminders.services.reap import reminders_reap
from reminders.services.record import (
    CHANNELS_HONOURING_KEYS,
    Verdict,
    channel_honours_keys,
    reminder_record_batch,
    reminder_release,
    reminder_release_interrupted,
    reminder_verdict,
    retry_delay,
)
from reminders.services.settle import reminders_settle

__all__ = [
    "CHANNELS_HONOURING_KEYS",
    "Claim",
    "Fate",
    "Source",
    "Verdict",
    "channel_honours_keys",
    "dispatches_prune",
    "message_expiry",
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
    "reminders_reap",
    "reminders_settle",
    "reminders_return",
    "reminders_unpublished",
    "replays_resume",
    "retry_delay",
    "SCAN_NAME",
    "scan_completed",
    "sources_locked",
]
