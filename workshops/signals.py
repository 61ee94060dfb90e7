"""Domain events other apps may react to, sent inside the writing transaction.

``workshops`` never imports the apps that listen (reminders does), so the
dependency points one way. Receivers run inside the same ``atomic`` block as
the change, so their writes commit or roll back with it.
"""

from django.dispatch import Signal

# Sent with workshop=<Workshop>, changed=<frozenset of field names>.
workshop_changed = Signal()
# Sent with enrollment=<Enrollment>, created=<bool>.
enrollment_changed = Signal()
# Sent with enrollment_ids=<list of int>: enrollments created together (an import, the API).
enrollments_added = Signal()
