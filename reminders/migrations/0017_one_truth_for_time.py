"""Reminder rows stop storing their window and deadline: every decision reads the
workshop's start as it is now (docs/runtime_packet.md, section 1.2).

The dropped columns were copies; nothing is lost. The new partial indexes find
a workshop's open rows (dispatch, settle) and its missed or cancelled rows (the
settle's reopening). Stop every worker and beat of the previous release before
migrating: their claims read the dropped columns.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("reminders", "0016_maybe_sent_help_text"),
        ("workshops", "0005_reminder_texts_and_languages"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="reminder",
            options={
                "ordering": ["id"],
                "permissions": [
                    ("replay_reminder", "Can replay reminders"),
                    ("resolve_unknown_reminder", "Can decide reminders whose outcome is unknown"),
                    ("send_test_reminder", "Can send themselves a test of a workshop's reminder"),
                ],
            },
        ),
        migrations.RemoveConstraint(
            model_name="reminder",
            name="reminder_window_before_deadline",
        ),
        migrations.RemoveIndex(
            model_name="reminder",
            name="reminder_due_open",
        ),
        migrations.RemoveIndex(
            model_name="reminder",
            name="reminder_status_deadline",
        ),
        migrations.RemoveField(
            model_name="reminder",
            name="deadline_at",
        ),
        migrations.RemoveField(
            model_name="reminder",
            name="window_opens_at",
        ),
        migrations.AddIndex(
            model_name="reminder",
            index=models.Index(
                condition=models.Q(("status__in", ["pending", "queued"])),
                fields=["workshop", "id"],
                name="reminder_open_by_workshop",
            ),
        ),
        migrations.AddIndex(
            model_name="reminder",
            index=models.Index(
                condition=models.Q(("status__in", ["missed", "cancelled"])),
                fields=["workshop"],
                name="reminder_reopenable",
            ),
        ),
        migrations.AddIndex(
            model_name="reminder",
            index=models.Index(fields=["status"], name="reminder_status"),
        ),
    ]
