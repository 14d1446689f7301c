"""The meter at 100,000 running usages: the usage table keeps half of each page free, so the tick's
UPDATE of every running usage stays on its page (a HOT update: no index touched); minute rows check no
foreign key per row; slices carry the meter's marker (backfilled here from the usages already open);
and ended usages' minutes fold into daily rows (UsageDay).
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

HALF_FREE = "ALTER TABLE billing_usage SET (fillfactor = 50)"
FULL = "ALTER TABLE billing_usage RESET (fillfactor)"


def half_free(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(HALF_FREE)


def full(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FULL)


def mark_metered(apps, schema_editor):
    Slice = apps.get_model("gpus", "Slice")
    Slice.objects.filter(usage__isnull=False).update(metered=True)


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0005_budgets_and_credit_stops"),
        ("gpus", "0001_initial"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="UsageDay",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("day", models.DateField()),
                ("first_minute", models.PositiveIntegerField()),
                ("minutes", models.PositiveIntegerField()),
                ("amount", models.DecimalField(decimal_places=6, max_digits=18)),
            ],
            options={
                "ordering": ["usage", "day"],
            },
        ),
        migrations.AddField(
            model_name="usage",
            name="folded",
            field=models.BooleanField(
                db_default=False,
                default=False,
                help_text="Its minute rows were folded into daily rows (billing/rollup.py).",
            ),
        ),
        migrations.AlterField(
            model_name="chargedminute",
            name="transaction",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="minutes",
                to="billing.ledgertransaction",
            ),
        ),
        migrations.AlterField(
            model_name="chargedminute",
            name="usage",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="minutes",
                to="billing.usage",
            ),
        ),
        migrations.AddIndex(
            model_name="usage",
            index=models.Index(
                condition=models.Q(("folded", False), ("open", False)), fields=["ended"], name="usage_to_fold_idx"
            ),
        ),
        migrations.AddField(
            model_name="usageday",
            name="usage",
            field=models.ForeignKey(
                db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name="days", to="billing.usage"
            ),
        ),
        migrations.AddIndex(
            model_name="usageday",
            index=models.Index(fields=["day"], name="usage_day_idx"),
        ),
        migrations.AddConstraint(
            model_name="usageday",
            constraint=models.UniqueConstraint(fields=("usage", "day"), name="usage_day_once"),
        ),
        migrations.RunPython(half_free, full),
        migrations.RunPython(mark_metered, migrations.RunPython.noop),
    ]
