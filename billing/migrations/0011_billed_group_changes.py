"""Who billed a group, changed whom it is billed to, or stopped billing it, when and why: one row per change,
which PostgreSQL refuses to update or delete (the append-only function of migration 0003), as for the
ledger. The groups billed before this get their marking recorded from what the billed group kept."""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models

TABLE = "billing_billedgroupchange"


def _run(schema_editor, sql):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(sql)


def rules(apps, schema_editor):
    _run(
        schema_editor,
        f"CREATE TRIGGER {TABLE}_append_only BEFORE UPDATE OR DELETE ON {TABLE} "
        "FOR EACH ROW EXECUTE FUNCTION billing_append_only();",
    )


def no_rules(apps, schema_editor):
    _run(schema_editor, f"DROP TRIGGER {TABLE}_append_only ON {TABLE};")


def record_marked(apps, schema_editor):
    BilledGroup = apps.get_model("billing", "BilledGroup")
    BilledGroupChange = apps.get_model("billing", "BilledGroupChange")
    for billed in BilledGroup.objects.all():
        BilledGroupChange.objects.create(
            group_id=billed.group_id,
            action="marked",
            billing_name=billed.billing_name,
            billing_email=billed.billing_email,
            by_id=billed.marked_by_id,
            at=billed.marked_at,
        )


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("billing", "0010_billed_totals"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="BilledGroupChange",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "action",
                    models.CharField(
                        choices=[
                            ("marked", "Billed"),
                            ("changed", "Billed to changed"),
                            ("stopped", "Billing stopped"),
                        ],
                        max_length=10,
                    ),
                ),
                (
                    "billing_name",
                    models.CharField(help_text="Whom its invoices go to from then (stopped: went to).", max_length=200),
                ),
                ("billing_email", models.EmailField(blank=True, max_length=254)),
                (
                    "reason",
                    models.CharField(blank=True, help_text="Why; required to stop billing a group.", max_length=300),
                ),
                ("at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "by",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="+", to=settings.AUTH_USER_MODEL
                    ),
                ),
                (
                    "group",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="billing_changes", to="auth.group"
                    ),
                ),
            ],
            options={"ordering": ["-at", "-id"]},
        ),
        migrations.RunPython(rules, no_rules),
        migrations.RunPython(record_marked, migrations.RunPython.noop),
    ]
