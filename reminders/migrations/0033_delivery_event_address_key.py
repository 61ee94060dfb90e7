"""Record the address each provider report is about, by its key: a run of soft bounces is
counted per address the messages went to, not across an attendee's corrections.

Reports kept before stay blank and count in no run: a run under way at the upgrade starts
again (a hard bounce or a complaint suppresses as before).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("reminders", "0032_delivery_event_received"),
    ]

    operations = [
        migrations.AddField(
            model_name="deliveryevent",
            name="address_key",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                editable=False,
                help_text="The address_key of the address the message went to (a run of soft "
                "bounces is counted per address); blank for reports kept before it was recorded.",
                max_length=64,
            ),
        ),
    ]
