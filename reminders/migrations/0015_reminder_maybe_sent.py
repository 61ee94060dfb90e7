"""Reminder.maybe_sent: a call ended without a definite answer, kept across claims.

Rows already ``unknown``, and rows with an attempt that timed out, was stopped
mid-call or lost its worker, get it set: the provider may hold them.
"""

from django.db import migrations, models

_NO_ANSWER = ("timed_out", "cancelled", "lease_expired")


def backfill(apps, schema_editor):
    Reminder = apps.get_model("reminders", "Reminder")
    DeliveryAttempt = apps.get_model("reminders", "DeliveryAttempt")
    Reminder.objects.filter(status="unknown").update(maybe_sent=True)
    Reminder.objects.filter(
        pk__in=DeliveryAttempt.objects.filter(outcome__in=_NO_ANSWER).values("reminder_id")
    ).update(maybe_sent=True)


class Migration(migrations.Migration):
    dependencies = [
        ("reminders", "0014_reminder_queued_at"),
    ]

    operations = [
        migrations.AddField(
            model_name="reminder",
            name="maybe_sent",
            field=models.BooleanField(
                db_default=False,
                default=False,
                editable=False,
                help_text=(
                    "Set once a call for this reminder ended without a definite answer (timed "
                    "out, stopped mid-call, worker lost) and never cleared: past its deadline or "
                    "its attempt cap such a reminder is marked unknown, never missed or failed."
                ),
                verbose_name="may have reached the provider",
            ),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
