"""What PostgreSQL holds beyond the tables (remade with the apps of issue 31; SQLite has neither):

- The GPU table's pages keep room for new row versions (fillfactor 70): the allocator rewrites a GPU's layout
  on every claim and release, and with no index on those columns each rewrite is a HOT update (the new version
  on the same page, no index touched), which needs free room on the page (a fleet of 1,000 GPUs is about 80
  pages; bench/results/notes.md, issue 12).

(It also made a trigger that sent an agent the notice of a new order from the recording transaction; no longer:
see 0003.)
"""

from collections.abc import Callable
from typing import Any

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor


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
    ]
