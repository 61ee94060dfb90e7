"""Every admin of the project, the workshops app's included.

workshops never imports reminders, so its admins live here. Staff change things
only through confirmed actions (actions.py) that call the services.
"""

from reminders.admin import (  # noqa: F401
    attendee,
    decision,
    enrollment,
    reminder,
    suppression,
    workshop,
)
