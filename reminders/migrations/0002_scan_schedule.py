"""Register the periodic scan with django-celery-beat's database scheduler.

An interval (not a crontab): the scan is "every N seconds", with no calendar
meaning. The interval follows REMINDERS_SCAN_INTERVAL at every beat start
(reminders.schedule.ensure_scan_schedule, run by reminders.beat.ScanScheduler
before its first read), so changing the variable and restarting beat is enough.
"""

from django.db import migrations


def register(apps, schema_editor):
    from reminders.schedule import ensure_scan_schedule

    ensure_scan_schedule(
        interval_model=apps.get_model("django_celery_beat", "IntervalSchedule"),
        task_model=apps.get_model("django_celery_beat", "PeriodicTask"),
    )


def unregister(apps, schema_editor):
    from reminders.schedule import SCAN_TASK_NAME

    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(
        name=SCAN_TASK_NAME
    ).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("reminders", "0001_initial"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(register, unregister)]
