"""The staff surface: every admin of the project, workshops' included.

The workshops app never imports reminders, so the admins that show reminder
features on workshop and attendee pages live here, one class per model, each
registered once. Staff act through confirmed actions (actions.py) that call
the services; the admin decides nothing itself.
"""

from reminders.admin import attendee, decision, enrollment, reminder, workshop  # noqa: F401
