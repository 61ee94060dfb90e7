"""Reminder.queued_at: when a row entered the queue, for reminders_oldest_seconds.

Rows already queued get their ``updated_at``, the time the metric read until now.
"""

from django.db import migrations, models


def backfill(apps, schema_editor):
    Reminder = apps.get_model("reminders", "Reminder")
    Reminder.objects.filter(status="queued").update(queued_at=models.F("updated_at"))


class Migration(migrations.Migration):
    dependencies = [
        ("reminders", "0013_replay_use_edited_text"),
    ]

    operations = [
        migrations.AddField(
            model_name="reminder",
            name="queued_at",
            field=models.DateTimeField(
                blank=True,
                editable=False,
                help_text=(
                    "When this reminder last entered the queue: a new message for a row still "
                    "queued (its old one expired), a move or an edit keep this time."
                ),
                null=True,
            ),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
