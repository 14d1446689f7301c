from django.db import migrations, models

# Every insert or update of a GPU row records the id of the transaction that wrote it. Together with
# the oldest transaction still running when a reader looked (pg_snapshot_xmin), this tells a reader
# exactly which rows may have changed since: see sessions/gpus/fleetview.py.
STAMP = """
CREATE FUNCTION gpu_stamp_changed_xid() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.changed_xid := pg_current_xact_id()::text::bigint;
    RETURN NEW;
END $$;
CREATE TRIGGER gpu_stamp_changed_xid BEFORE INSERT OR UPDATE ON gpu_sessions_gpu
    FOR EACH ROW EXECUTE FUNCTION gpu_stamp_changed_xid();
"""
UNSTAMP = """
DROP TRIGGER IF EXISTS gpu_stamp_changed_xid ON gpu_sessions_gpu;
DROP FUNCTION IF EXISTS gpu_stamp_changed_xid();
"""


def stamp(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(STAMP)


def unstamp(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(UNSTAMP)


class Migration(migrations.Migration):
    dependencies = [("gpu_sessions", "0002_gpu_minutes")]

    operations = [
        migrations.AddField(
            model_name="gpu",
            name="changed_xid",
            field=models.BigIntegerField(default=0, editable=False),
        ),
        migrations.AddIndex(
            model_name="gpu",
            index=models.Index(fields=["changed_xid"], name="gpu_changed_xid_idx"),
        ),
        migrations.RunPython(stamp, unstamp),
    ]
