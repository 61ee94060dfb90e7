"""Reminder.maybe_sent's help text names every writer it changes, and the rows 0015 marked.

No SQL: the help text lives only in Django's model state.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("reminders", "0015_reminder_maybe_sent"),
    ]

    operations = [
        migrations.AlterField(
            model_name="reminder",
            name="maybe_sent",
            field=models.BooleanField(
                db_default=False,
                default=False,
                editable=False,
                help_text="Set once a call for this reminder ended without a definite answer (timed out, stopped mid-call, worker lost) and never cleared: from then on, past its deadline, at its attempt cap or refused by the provider, it is marked unknown, not missed or failed. A row already missed or failed when the upgrade set it keeps that status.",
                verbose_name="may have reached the provider",
            ),
        ),
    ]
