"""Why a reminder has the status it has: the ``status_reason`` texts staff read."""

from __future__ import annotations

ENROLLED_LATE = "enrolled after cutoff"
PLANNED_LATE = "deadline passed before the reminder was planned (was the scan running?)"
WORKSHOP_CANCELLED = "workshop cancelled"
ENROLLMENT_CANCELLED = "enrollment cancelled"
MOVED_INSIDE_CUTOFF = "workshop moved inside the cutoff"
MOVED_LATER = "workshop moved to a later start; planned again"
REINSTATED = "workshop reinstated; planned again"
REINSTATED_LATE = "workshop reinstated after the cutoff"

LATE_AT_CLAIM = "deadline passed before a worker could send it"
LATE_IN_QUEUE = "deadline passed while queued (were the workers running?)"
LATE_IN_RETRY = "deadline passed while retrying: {error}"
GAVE_UP = "gave up after {attempts} attempts: {error}"
MAYBE_SENT = "{what}; the provider may have accepted it (channel {channel} has no idempotency key)"
LEASE_LOST = "worker lost during the send (lease expired)"
# Not tried again after a call with no definite answer: maybe delivered, so neither
# missed nor failed. It leads, so a long error cannot cut it off at 200 characters.
MAYBE_SENT_NOT_RETRIED = (
    "the provider may have accepted it (no definite answer); not tried again: {why}"
)
