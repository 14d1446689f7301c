"""Agents take orders in a time that does not grow with the orders waiting (issue 31's benchmark):

- An index of each GPU's pending orders, for the question asked of every order an agent takes: is an earlier
  order of its GPU still pending? Without it, each look walked every pending order of the host.
- An order's notice is no longer sent by a trigger in the transaction that records it, but just after that
  commits (``sessions.gpus.orders.wake``): PostgreSQL commits notifying transactions one at a time, each waiting
  for the disk, which made every allocation and release wait for the ones before it.
"""

from typing import Any

from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor


def _drop_the_notice_trigger(apps: Any, schema_editor: BaseDatabaseSchemaEditor) -> None:
    """Gone from databases migrated before this change (0002 made it then)."""
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "DROP TRIGGER IF EXISTS gpu_host_order_notify ON gpus_hostorder;"
            " DROP FUNCTION IF EXISTS gpu_host_order_notify();"
        )


class Migration(migrations.Migration):
    dependencies = [("gpus", "0002_postgresql_storage_and_order_notices")]

    operations = [
        migrations.AddIndex(
            model_name="hostorder",
            index=models.Index(
                condition=models.Q(("state", "pending")), fields=["gpu", "id"], name="hostorder_pending_gpu_idx"
            ),
        ),
        migrations.RunPython(_drop_the_notice_trigger, migrations.RunPython.noop),
    ]
