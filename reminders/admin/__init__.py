"""Every admin; the workshops app's live here, as workshops never imports reminders."""

from reminders.admin import (  # noqa: F401
    attendee,
    decision,
    enrollment,
    reminder,
    suppression,
    workshop,
)
