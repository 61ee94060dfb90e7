"""A claim token is held exactly while a reminder is ``sending``.

Every writer already cleared the token when a row left ``sending``; rows written otherwise
(none are known) lose it first, so the constraint can be added.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("reminders", "0027_reminder_unsubscribed"),
    ]

    operations = [
        migrations.RunSQL(
            "UPDATE reminders_reminder SET claim_token = NULL "
            "WHERE status <> 'sending' AND claim_token IS NOT NULL",
            migrations.RunSQL.noop,
        ),
        migrations.RemoveConstraint(
            model_name="reminder",
            name="reminder_sending_has_lease",
        ),
        migrations.AddConstraint(
            model_name="reminder",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    status="sending", claim_token__isnull=False, lease_expires_at__isnull=False
                )
                | (~models.Q(status="sending") & models.Q(claim_token__isnull=True)),
                name="reminder_claimed_while_sending",
            ),
        ),
    ]
