"""A notice holds a claim token and a lease exactly while it is sending, as a reminder does
(reminder_claimed_while_sending): a write that breaks it is refused by the database.

No code leaves a token outside sending; the cleanup before the constraint clears any such row
an earlier version may have left, so the upgrade does not stop on it. The silenced status's
label names each way to it (no SQL).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("reminders", "0033_delivery_event_address_key"),
    ]

    operations = [
        migrations.AlterField(
            model_name="notice",
            name="status",
            field=models.CharField(
                choices=[
                    ("pending", "Pending"),
                    ("sending", "Sending (claimed by a worker)"),
                    ("sent", "Sent"),
                    ("failed", "Failed"),
                    ("missed", "Missed (the workshop started)"),
                    ("unknown", "Unknown (may have reached the provider)"),
                    ("superseded", "Superseded by a newer revision"),
                    ("silenced", "Not sent (staff, an unsubscribe or an erasure stopped it)"),
                ],
                default="pending",
                editable=False,
                max_length=16,
            ),
        ),
        migrations.RunSQL(
            "UPDATE reminders_notice SET claim_token = NULL WHERE status <> 'sending'",
            migrations.RunSQL.noop,
        ),
        migrations.AddConstraint(
            model_name="notice",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    status="sending", claim_token__isnull=False, lease_expires_at__isnull=False
                )
                | (~models.Q(status="sending") & models.Q(claim_token__isnull=True)),
                name="notice_claimed_while_sending",
            ),
        ),
    ]
