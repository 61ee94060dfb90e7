"""Index providers' reports by when they came: each scan's prune looks for the old ones."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("reminders", "0031_sent_to"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="deliveryevent",
            index=models.Index(fields=["received_at"], name="delivery_event_received"),
        ),
    ]
