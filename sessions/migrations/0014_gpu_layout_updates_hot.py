"""The GPU table's layout columns leave every index, and its pages keep room for new row versions.

The allocator rewrites a GPU's layout on every claim and release. While an index held those columns,
each rewrite added an entry to all six of the table's indexes and the placement index filled with dead
entries; now a rewrite is a HOT update (the new version on the same page, no index touched), which
needs free room on the page: fillfactor 70 (a fleet of 1,000 GPUs is about 80 pages).
"""

from collections.abc import Callable
from typing import Any

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor


def _storage(sql: str) -> Callable[[Any, BaseDatabaseSchemaEditor], None]:
    def run(apps: Any, schema_editor: BaseDatabaseSchemaEditor) -> None:
        if schema_editor.connection.vendor == "postgresql":  # SQLite has no fillfactor
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("gpu_sessions", "0013_notebook_start_stop_sent")]

    operations = [
        migrations.RemoveIndex(model_name="gpu", name="gpu_placement_idx"),
        migrations.RunPython(
            _storage("ALTER TABLE gpu_sessions_gpu SET (fillfactor = 70)"),
            _storage("ALTER TABLE gpu_sessions_gpu RESET (fillfactor)"),
        ),
    ]
