"""What PostgreSQL holds beyond the tables (remade with the apps of issue 31; SQLite has neither):

- The GPU table's pages keep room for new row versions (fillfactor 70): the allocator rewrites a GPU's layout
  on every claim and release, and with no index on those columns each rewrite is a HOT update (the new version
  on the same page, no index touched), which needs free room on the page (a fleet of 1,000 GPUs is about 80
  pages; bench/results/notes.md, issue 12).
- An agent hears of a new order at once (``LISTEN gpu_host_orders``, sessions/gpus/orders.py) instead of
  polling for it: a trigger sends the notice when the transaction that recorded the order commits.
"""

from collections.abc import Callable
from typing import Any

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

NOTIFY = """
CREATE FUNCTION gpu_host_order_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('gpu_host_orders', NEW.host_id::text);
    RETURN NULL;
END $$;
CREATE TRIGGER gpu_host_order_notify AFTER INSERT ON gpus_hostorder
    FOR EACH ROW EXECUTE FUNCTION gpu_host_order_notify();
"""
NOTIFY_GONE = "DROP TRIGGER gpu_host_order_notify ON gpus_hostorder; DROP FUNCTION gpu_host_order_notify();"


def _postgresql(sql: str) -> Callable[[Any, BaseDatabaseSchemaEditor], None]:
    def run(apps: Any, schema_editor: BaseDatabaseSchemaEditor) -> None:
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("gpus", "0001_initial")]

    operations = [
        migrations.RunPython(
            _postgresql("ALTER TABLE gpus_gpu SET (fillfactor = 70)"),
            _postgresql("ALTER TABLE gpus_gpu RESET (fillfactor)"),
        ),
        migrations.RunPython(_postgresql(NOTIFY), _postgresql(NOTIFY_GONE)),
    ]
