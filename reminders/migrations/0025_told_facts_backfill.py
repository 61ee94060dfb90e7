"""Fill in what reminders sent before change notices were told.

Their messages were never stored, so the facts they carried are not known.
Since every send renders the workshop as its claim read it, and the claim
watch withdraws a call whose shown facts changed before it started, a
reminder told the facts the workshop had when it was sent. The nearest record
of those is the workshop as it is at the upgrade: each sent or unknown
reminder takes it, not cancelled (no reminder goes to a cancelled workshop).
So a move made before the upgrade is not noticed, and a cancellation made
before it is (its attendees hear of it at the first scan, if the start is
still ahead). The reverse migration has nothing to undo.
"""

from django.db import migrations
from django.db.models import OuterRef, Subquery


def told_from_workshops(apps, schema_editor):
    Reminder = apps.get_model("reminders", "Reminder")
    Workshop = apps.get_model("workshops", "Workshop")
    workshop = Workshop.objects.filter(pk=OuterRef("workshop_id"))
    Reminder.objects.filter(status__in=["sent", "unknown"], told_starts_at__isnull=True).update(
        told_starts_at=Subquery(workshop.values("starts_at")[:1]),
        told_ends_at=Subquery(workshop.values("ends_at")[:1]),
        told_location=Subquery(workshop.values("location")[:1]),
        told_join_url=Subquery(workshop.values("join_url")[:1]),
        told_cancelled=False,
    )


class Migration(migrations.Migration):
    dependencies = [
        ("reminders", "0024_change_notices"),
        ("workshops", "0007_notice_intro_and_cancellation_reason"),
    ]

    operations = [migrations.RunPython(told_from_workshops, migrations.RunPython.noop)]
