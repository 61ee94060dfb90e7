"""Drop two foreign-key indexes a unique pair already leads with.

``(attendee, workshop)`` covers ``Reminder.attendee`` and ``(reminder, number)`` covers
``DeliveryAttempt.reminder``; every claim and record wrote both for nothing.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("reminders", "0028_claimed_while_sending"),
        ("workshops", "0007_notice_intro_and_cancellation_reason"),
    ]

    operations = [
        migrations.AlterField(
            model_name="deliveryattempt",
            name="reminder",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="attempts_log",
                to="reminders.reminder",
            ),
        ),
        migrations.AlterField(
            model_name="reminder",
            name="attendee",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="reminders",
                to="workshops.attendee",
            ),
        ),
    ]
