"""Print one reminder's timeline: planned, each claim and outcome, the reaper, staff decisions."""

from django.core.management.base import BaseCommand, CommandError

from reminders.models import Reminder
from reminders.trace import reminder_lookup, trace_lines


class Command(BaseCommand):
    help = (
        "Print the timeline of one reminder, given its id or its key (e.g. rem-w12-a34): when "
        "it was planned, each claim and its outcome, the reaper's decisions, staff replays and "
        "resolutions, the attendee's unsubscribe, and its state now; times in UTC and in the "
        "workshop's zone."
    )

    def add_arguments(self, parser):
        parser.add_argument("reminder", help="the reminder's id (as in the admin) or its key")

    def handle(self, *args, **options):
        identifier = options["reminder"]
        try:
            reminder = reminder_lookup(identifier)
        except Reminder.DoesNotExist:
            raise CommandError(
                f"No reminder has the id or key {identifier!r}. Give the number the admin shows "
                "for it, or its key (the idempotency key, such as rem-w12-a34)."
            ) from None
        for line in trace_lines(reminder):
            self.stdout.write(line)
