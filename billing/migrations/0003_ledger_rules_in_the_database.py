"""The ledger's rules, enforced by PostgreSQL itself: every transaction's entries sum to zero (checked at
commit, so the entries of one transaction may be written one by one), and ledger rows are never updated
or deleted (a correction is a reversing transaction). SQLite, the zero-config default, migrates without
them; there the ledger service checks the balance before it writes.

Also creates the portal's own accounts, which every posting needs.
"""

from django.db import migrations

POSTGRESQL_RULES = """
CREATE FUNCTION billing_entries_balance() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT COALESCE(SUM(amount), 0) FROM billing_entry WHERE transaction_id = NEW.transaction_id) <> 0 THEN
        RAISE EXCEPTION 'ledger transaction % does not balance: its entries must sum to zero', NEW.transaction_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER billing_entry_balanced AFTER INSERT ON billing_entry
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION billing_entries_balance();

CREATE FUNCTION billing_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: correct it with a reversing transaction', TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation';
END $$;
CREATE TRIGGER billing_entry_append_only BEFORE UPDATE OR DELETE ON billing_entry
    FOR EACH ROW EXECUTE FUNCTION billing_append_only();
CREATE TRIGGER billing_transaction_append_only BEFORE UPDATE OR DELETE ON billing_ledgertransaction
    FOR EACH ROW EXECUTE FUNCTION billing_append_only();
"""

POSTGRESQL_UNDO = """
DROP TRIGGER billing_transaction_append_only ON billing_ledgertransaction;
DROP TRIGGER billing_entry_append_only ON billing_entry;
DROP FUNCTION billing_append_only();
DROP TRIGGER billing_entry_balanced ON billing_entry;
DROP FUNCTION billing_entries_balance();
"""

PORTAL_ACCOUNTS = ["revenue_on_demand", "revenue_spot", "promotional", "top_ups"]


def _run(schema_editor, sql):
    """On PostgreSQL only; without parameters, so the messages' % placeholders reach plpgsql as they are."""
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(sql)


def rules(apps, schema_editor):
    _run(schema_editor, POSTGRESQL_RULES)


def no_rules(apps, schema_editor):
    _run(schema_editor, POSTGRESQL_UNDO)


def portal_accounts(apps, schema_editor):
    Account = apps.get_model("billing", "Account")
    for kind in PORTAL_ACCOUNTS:
        Account.objects.get_or_create(kind=kind, user=None)


class Migration(migrations.Migration):
    dependencies = [("billing", "0002_prices_meter_ledger")]

    operations = [
        migrations.RunPython(rules, no_rules),
        migrations.RunPython(portal_accounts, migrations.RunPython.noop),
    ]
