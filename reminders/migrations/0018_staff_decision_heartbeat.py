"""Background replays get a heartbeat, so the scan can hand a stalled one to a worker again.

Replays already running when this runs are given their creation time: the
next scan resumes any that no task is working on.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("reminders", "0017_one_truth_for_time"),
    ]

    operations = [
        # Added first, then filled for the replays already running.
        migrations.AddField(
            model_name="staffdecision",
            name="heartbeat_at",
            field=models.DateTimeField(
                blank=True,
                editable=False,
                help_text="When a worker last moved a background replay on (the database's clock); the scan hands one that stalled to a worker again.",
                null=True,
            ),
        ),
        migrations.RunSQL(
            "UPDATE reminders_staffdecision SET heartbeat_at = created_at "
            "WHERE state = 'running' AND heartbeat_at IS NULL",
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
