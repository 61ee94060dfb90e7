"""ReplayAudit becomes StaffDecision: one audit model for every staff decision.

The rows are kept (RenameModel); cancel and reinstate join the actions, and
workshop_ids records which workshops such a decision changed.
"""

from django.db import migrations, models


def rename_permissions(apps, schema_editor):
    """Keep what staff were granted: view_replayaudit becomes view_staffdecision, and so on."""
    Permission = apps.get_model("auth", "Permission")
    for permission in Permission.objects.filter(
        content_type__app_label="reminders", codename__endswith="_replayaudit"
    ):
        permission.codename = permission.codename.replace("_replayaudit", "_staffdecision")
        permission.name = permission.name.replace("replay audit", "staff decision")
        permission.save(update_fields=["codename", "name"])


def restore_permissions(apps, schema_editor):
    Permission = apps.get_model("auth", "Permission")
    for permission in Permission.objects.filter(
        content_type__app_label="reminders", codename__endswith="_staffdecision"
    ):
        permission.codename = permission.codename.replace("_staffdecision", "_replayaudit")
        permission.name = permission.name.replace("staff decision", "replay audit")
        permission.save(update_fields=["codename", "name"])


class Migration(migrations.Migration):
    dependencies = [
        ("reminders", "0005_scan_run"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [
        migrations.RemoveConstraint(model_name="replayaudit", name="replay_audit_action_valid"),
        migrations.RenameModel(old_name="ReplayAudit", new_name="StaffDecision"),
        migrations.RunPython(rename_permissions, restore_permissions),
        migrations.AlterModelOptions(
            name="staffdecision",
            options={"ordering": ["-created_at", "-id"], "verbose_name": "staff decision"},
        ),
        migrations.AlterField(
            model_name="staffdecision",
            name="action",
            field=models.CharField(
                choices=[
                    ("replay", "Replay"),
                    ("mark_sent", "Unknown outcome resolved: marked as sent"),
                    ("send_again", "Unknown outcome resolved: sent again"),
                    ("cancel", "Workshops cancelled"),
                    ("reinstate", "Workshops reinstated"),
                ],
                editable=False,
                max_length=16,
            ),
        ),
        migrations.AlterField(
            model_name="staffdecision",
            name="selected",
            field=models.PositiveIntegerField(
                editable=False, help_text="Reminders (or workshops) in the selection."
            ),
        ),
        migrations.AlterField(
            model_name="staffdecision",
            name="changed",
            field=models.PositiveIntegerField(
                editable=False, help_text="Reminders (or workshops) the decision changed."
            ),
        ),
        migrations.AlterField(
            model_name="staffdecision",
            name="queued",
            field=models.PositiveIntegerField(
                default=0, editable=False, help_text="Reminders queued for delivery after commit."
            ),
        ),
        migrations.AlterField(
            model_name="staffdecision",
            name="skipped",
            field=models.JSONField(
                default=dict, editable=False, help_text="Left alone, counted by reason."
            ),
        ),
        migrations.AddField(
            model_name="staffdecision",
            name="workshop_ids",
            field=models.JSONField(
                default=list,
                editable=False,
                help_text="Ids of the workshops cancelled or reinstated.",
            ),
        ),
        migrations.AddConstraint(
            model_name="staffdecision",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("action__in", ["replay", "mark_sent", "send_again", "cancel", "reinstate"])
                ),
                name="staff_decision_action_valid",
            ),
        ),
    ]
