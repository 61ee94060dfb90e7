"""Which attendees an integration created through the API: its refs to them say so.

The refs that exist are marked where the audit shows it: an API write of
``POST /api/attendees`` answered 201 records ``{"attendee": id, "outcome":
"created"}``, so that token's integration created that attendee. An enrolments
write records ``attendees_changed`` alone, created and updated together, so it
shows nothing; neither do refs the CSV import made (staff's). Every other ref
stays False: the integration may then enrol and name the attendee, not change
their details (the safe side; staff can).
"""

from django.db import migrations, models

CHUNK = 1000


def mark_created(apps, schema_editor):
    ApiWrite = apps.get_model("intake", "ApiWrite")
    AttendeeRef = apps.get_model("intake", "AttendeeRef")
    created: dict[int, set[int]] = {}  # integration -> attendees it created
    writes = ApiWrite.objects.filter(
        method="POST", status=201, path__endswith="/api/attendees", summary__outcome="created"
    ).values_list("token__integration_id", "summary")
    for integration_id, summary in writes.iterator(chunk_size=CHUNK):
        attendee = summary.get("attendee")
        if isinstance(attendee, int) and not isinstance(attendee, bool):
            created.setdefault(integration_id, set()).add(attendee)
    for integration_id, attendees in created.items():
        ordered = sorted(attendees)
        for start in range(0, len(ordered), CHUNK):
            AttendeeRef.objects.filter(
                integration_id=integration_id, attendee_id__in=ordered[start : start + CHUNK]
            ).update(created_attendee=True)


class Migration(migrations.Migration):
    dependencies = [
        ("intake", "0002_csv_import_request_token"),
    ]

    operations = [
        migrations.AddField(
            model_name="attendeeref",
            name="created_attendee",
            field=models.BooleanField(
                db_default=False,
                default=False,
                editable=False,
                help_text="The integration created this attendee through the API.",
            ),
        ),
        migrations.RunPython(mark_created, migrations.RunPython.noop),
    ]
