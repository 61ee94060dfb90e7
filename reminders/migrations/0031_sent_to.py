"""Record the address each reminder and change notice went to, and fill it in for those sent.

The address of a message sent before the upgrade was never stored; the nearest record of it
is the attendee's address at the upgrade (what a provider's report suppressed until now).
Erased attendees' rows stay blank. The reverse migration has nothing to undo.
"""

from django.db import migrations, models
from django.db.models import OuterRef, Q, Subquery


def sent_to_from_attendees(apps, schema_editor):
    Attendee = apps.get_model("workshops", "Attendee")
    email = Subquery(Attendee.objects.filter(pk=OuterRef("attendee_id")).values("email")[:1])
    for name in ("Reminder", "Notice"):
        apps.get_model("reminders", name).objects.filter(
            Q(status__in=["sent", "unknown", "sending"]) | Q(maybe_sent=True),
            attendee__erased_at__isnull=True,
        ).update(sent_to=email)


class Migration(migrations.Migration):
    dependencies = [
        ("reminders", "0030_dispatch_publish_failed"),
    ]

    operations = [
        migrations.AddField(
            model_name="notice",
            name="sent_to",
            field=models.EmailField(
                blank=True,
                db_default="",
                default="",
                editable=False,
                help_text="The address its last claim's message went to (as a reminder's).",
                max_length=254,
            ),
        ),
        migrations.AddField(
            model_name="reminder",
            name="sent_to",
            field=models.EmailField(
                blank=True,
                db_default="",
                default="",
                editable=False,
                help_text="The address its last claim's message went to: a provider's bounce or "
                "complaint suppresses it, even after the attendee's address was corrected.",
                max_length=254,
            ),
        ),
        migrations.RunPython(sent_to_from_attendees, migrations.RunPython.noop),
    ]
