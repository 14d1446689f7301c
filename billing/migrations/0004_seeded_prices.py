"""The starting prices and their source: billing/seeds.py (the seeds' A100 at 8.5 CNY an hour, scaled)."""

from django.db import migrations

from billing import seeds


def seed(apps, schema_editor):
    seeds.ensure(apps.get_model("billing", "Price"))


class Migration(migrations.Migration):
    dependencies = [("billing", "0003_ledger_rules_in_the_database")]

    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
