"""Record when the broker refused a dispatch's message, for the trace."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("reminders", "0029_covered_foreign_key_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="dispatch",
            name="publish_failed_at",
            field=models.DateTimeField(
                blank=True,
                editable=False,
                help_text="When the broker refused the message; its rows were made due again then.",
                null=True,
            ),
        ),
    ]
