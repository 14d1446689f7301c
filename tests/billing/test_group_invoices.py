"""Group invoices over minutes the real meter charged: a billed group's month lists each member's lines and
totals from the member's own invoice, is issued once per group and month and never changed, names the
other billed groups a member is on, and is seen by staff and by members granted the permission only, as a
page and a CSV; beat's task, the command, staff's Billed groups page and the admin issue and mark them.
"""

from __future__ import annotations

import csv
import io
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from celery.schedules import crontab
from django.contrib.auth.models import Group, Permission, User
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.management import call_command
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from billing import group_invoices, invoices, ledger, meter
from billing.models import (
    Account,
    BilledGroup,
    BilledGroupChange,
    Entry,
    GroupInvoice,
    GroupInvoiceMember,
    Invoice,
    InvoiceLine,
    LedgerTransaction,
)
from billing.tasks import issue_group_invoices
from portal.celery import app
from portal.clock import database_now
from tests.billing.conftest import H200_3G, Hold
from tests.factories import make_user

pytestmark = pytest.mark.django_db
postgresql_only = pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL only (its triggers)")


def client_of(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def last_month_start() -> datetime:
    return invoices.month_bounds(invoices.last_month())[0]


def group_of(name: str, *members: User, billed_by: User | None = None) -> Group:
    group = Group.objects.create(name=name)
    group.user_set.add(*members)
    if billed_by is not None:
        group_invoices.mark(group, f"{name} department", f"{name}@example.org", by=billed_by)
    return group


def credit_posted_at(user: User, amount: str, moment: datetime) -> None:
    """A grant as the ledger would have posted it at ``moment`` (the ledger's rows are never moved later)."""
    posted = LedgerTransaction.objects.create(kind=LedgerTransaction.Kind.GRANT, posted_at=moment, user=user, memo="t")
    source = ledger.portal_account(Account.Kind.PROMOTIONAL)
    Entry.objects.bulk_create(
        [
            Entry(transaction=posted, account=source, amount=-Decimal(amount)),
            Entry(transaction=posted, account=ledger.wallet(user), amount=Decimal(amount)),
        ]
    )


def may_see_group_invoices(user: User) -> User:
    user.user_permissions.add(Permission.objects.get(codename="view_own_group_invoices"))
    return User.objects.get(pk=user.pk)  # a fresh object: Django caches permissions on the instance


@pytest.fixture
def charged(hold: Hold, alice: User, bob: User) -> datetime:
    """Last month: alice's A100 for 25 minutes and her MIG slice for 8, bob's A100 for 3; all charged."""
    last, now = last_month_start(), database_now()
    hold(alice, now - (last + timedelta(days=2)), lasted=timedelta(minutes=24, seconds=30))
    hold(alice, now - (last + timedelta(days=3)), H200_3G, lasted=timedelta(minutes=7, seconds=5))
    hold(bob, now - (last + timedelta(days=4)), lasted=timedelta(minutes=2, seconds=1))
    assert meter.tick().minutes == 25 + 8 + 3
    return last


@pytest.fixture
def physics(charged: datetime, alice: User, bob: User, staff: User, roles: None) -> Group:
    """A billed group of alice and bob, and dora, a member charged nothing."""
    return group_of("physics", alice, bob, make_user("dora", ["users"]), billed_by=staff)


def issued(group: Group) -> GroupInvoice:
    found = group_invoices.issue(group, invoices.last_month())
    assert found is not None
    return GroupInvoice.objects.get(pk=found.pk)  # as the database holds it (six decimals)


def test_a_billed_groups_invoice_lists_each_charged_members_lines_and_totals(
    physics: Group, alice: User, bob: User
) -> None:
    found = issued(physics)
    own = {invoice.user_id: invoice for invoice in Invoice.objects.all()}
    assert set(own) == {alice.pk, bob.pk}  # the members' own invoices, issued on the way; dora had none
    rows = list(found.members.all())
    assert [row.member for row in rows] == [alice, bob]
    assert [(row.invoice_id, row.minutes, row.total) for row in rows] == [
        (own[alice.pk].pk, 33, own[alice.pk].total),
        (own[bob.pk].pk, 3, own[bob.pk].total),
    ]
    assert found.minutes == 36 and found.total == own[alice.pk].total + own[bob.pk].total
    assert found.credit_applied == 0 and found.balance_due == found.total  # nobody had credit
    assert (found.billing_name, found.billing_email, found.currency) == (
        "physics department",
        "physics@example.org",
        "CNY",
    )
    assert found.label == f"GRP-{found.number:06d}" and found.month == invoices.last_month()
    members = group_invoices.members_of(found)
    assert [[item.line.minutes for item in shown.lines] for shown in members] == [[25, 8], [3]]


def test_credit_applied_is_what_each_members_wallet_covered(physics: Group, alice: User) -> None:
    credit_posted_at(alice, "1.00", last_month_start() - timedelta(days=1))
    found = issued(physics)
    on_it = {row.member.username: row for row in found.members.select_related("member")}
    assert (on_it["alice"].credit_applied, on_it["bob"].credit_applied) == (Decimal(1), Decimal(0))
    assert on_it["alice"].credit_applied == Invoice.objects.get(user=alice).credit_applied
    assert found.credit_applied == Decimal(1) and found.balance_due == found.total - Decimal(1)


def test_issuing_twice_never_duplicates(physics: Group) -> None:
    first = issued(physics)
    assert issued(physics).pk == first.pk
    assert [invoice.pk for invoice in group_invoices.issue_month(invoices.last_month())] == [first.pk]
    assert GroupInvoice.objects.count() == 1 and GroupInvoiceMember.objects.count() == 2
    assert Invoice.objects.count() == 2


def test_the_database_holds_one_group_invoice_per_group_and_month(physics: Group) -> None:
    first = issued(physics)
    with pytest.raises(IntegrityError), transaction.atomic():
        GroupInvoice.objects.create(
            number=first.number + 1, group=physics, month=first.month, billing_name="x", currency="CNY",
            minutes=0, total=0, credit_applied=0, balance_due=0,
        )  # fmt: skip


def test_a_group_not_billed_or_not_charged_gets_none(charged: datetime, alice: User, staff: User) -> None:
    unbilled = group_of("chemistry", alice)
    with pytest.raises(ValidationError, match="not billed"):
        group_invoices.issue(unbilled, invoices.last_month())
    idle = group_of("idle", make_user("eve", ["users"]), billed_by=staff)
    assert group_invoices.issue(idle, invoices.last_month()) is None
    with pytest.raises(ValidationError, match="has not ended"):
        group_invoices.issue(idle, database_now().date())
    assert GroupInvoice.objects.count() == 0


def test_a_person_in_two_billed_groups_is_on_both_and_each_says_so(physics: Group, alice: User, staff: User) -> None:
    group_of("astro", alice, billed_by=staff)
    issued_now = {invoice.group.name: invoice for invoice in group_invoices.issue_month(invoices.last_month())}
    assert set(issued_now) == {"astro", "physics"}
    on_physics = issued_now["physics"].members.get(member=alice)
    on_astro = issued_now["astro"].members.get(member=alice)
    assert on_physics.invoice_id == on_astro.invoice_id  # the same charges, one wallet, one own invoice
    assert (on_physics.also_billed_to, on_astro.also_billed_to) == ("astro", "physics")
    assert issued_now["physics"].members.get(member__username="bob").also_billed_to == ""
    html = client_of(staff).get(reverse("billing-group-invoice", args=[issued_now["physics"].number])).content
    assert "Also on the invoices of astro: the same charges, paid once, from alice's wallet." in html.decode()


def test_an_issued_group_invoice_refuses_changes_in_python(physics: Group) -> None:
    found = issued(physics)
    found.total = Decimal(0)
    with pytest.raises(ValidationError, match="never changed"):
        found.save()
    with pytest.raises(ValidationError, match="never deleted"):
        found.members.first().delete()  # type: ignore[union-attr]


@postgresql_only
def test_postgresql_refuses_editing_or_deleting_an_issued_group_invoice(physics: Group) -> None:
    found = issued(physics)
    for attempt in (
        lambda: GroupInvoice.objects.filter(pk=found.pk).update(total=0),
        lambda: GroupInvoiceMember.objects.filter(group_invoice=found).update(total=1),
        lambda: GroupInvoiceMember.objects.filter(group_invoice=found)._raw_delete(connection.alias),
        lambda: GroupInvoice.objects.filter(pk=found.pk)._raw_delete(connection.alias),
    ):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            attempt()
    assert GroupInvoice.objects.get(pk=found.pk).total == found.total and found.members.count() == 2


def test_staff_and_members_with_the_permission_see_it_and_nobody_else(
    physics: Group, alice: User, bob: User, staff: User, roles: None
) -> None:
    found = issued(physics)
    outsider = may_see_group_invoices(make_user("mallory", ["users"]))
    treasurer = may_see_group_invoices(bob)
    urls = [reverse(name, args=[found.number]) for name in ("billing-group-invoice", "billing-group-invoice-csv")]
    for url in urls:
        assert client_of(staff).get(url).status_code == 200
        assert client_of(treasurer).get(url).status_code == 200
        assert client_of(alice).get(url).status_code == 404  # a member, but not granted: others' usage is private
        assert client_of(outsider).get(url).status_code == 404  # granted, but not a member of physics
        assert Client().get(url).status_code == 302
    assert client_of(treasurer).get(reverse("billing-group-invoice", args=[found.number + 9])).status_code == 404
    assert found.label in client_of(treasurer).get(reverse("billing-account")).content.decode()
    assert found.label not in client_of(alice).get(reverse("billing-account")).content.decode()
    assert found.label not in client_of(outsider).get(reverse("billing-account")).content.decode()


def test_the_page_shows_members_lines_totals_and_a_members_credit_note(
    physics: Group, alice: User, staff: User
) -> None:
    found = issued(physics)
    own = Invoice.objects.get(user=alice)
    note = invoices.credit_note(own, by=staff, reason="GPU faulty")
    html = client_of(staff).get(reverse("billing-group-invoice", args=[found.number])).content.decode()
    assert f"Group invoice {found.label}" in html and "physics department &lt;physics@example.org&gt;" in html
    assert html.count('data-testid="group-invoice-line"') == 3 and "3g.71gb" in html
    assert f"{found.total.quantize(Decimal('0.01'))} CNY" in html and own.label in html
    assert f"{own.label} reversed by credit note {note.label}" in html
    assert 'media="print"' in html and "/static/css/invoice-print." in html
    assert GroupInvoice.objects.get(pk=found.pk).total == found.total  # the note changed the member's wallet only


def test_the_csv_has_every_members_lines_their_totals_and_the_totals(
    physics: Group, alice: User, bob: User, staff: User
) -> None:
    found = issued(physics)
    response = client_of(staff).get(reverse("billing-group-invoice-csv", args=[found.number]))
    assert response["Content-Type"].startswith("text/csv")
    assert f'filename="{found.label}-{found.month:%Y-%m}.csv"' in response["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[0] == [
        "group invoice",
        found.label,
        "group",
        "physics",
        "month",
        f"{found.month:%Y-%m}",
        "currency",
        "CNY",
    ]
    assert rows[1] == ["billed to", "physics department", "physics@example.org"]
    assert rows[2][0] == "member" and rows[2][10:] == ["minutes", "rate per minute", "amount"]
    own = {invoice.user_id: invoice for invoice in Invoice.objects.all()}
    mig = InvoiceLine.objects.get(kind="mig")
    assert [(row[0], row[1], row[3], row[4], row[10], row[12]) for row in rows[3:6]] == [
        ("alice", own[alice.pk].label, "A100-SXM4-80GB", "whole", "25", str(Decimal("0.141667") * 25)),
        ("alice", own[alice.pk].label, mig.gpu_model, "mig", "8", str(mig.amount)),
        ("bob", own[bob.pk].label, "A100-SXM4-80GB", "whole", "3", str(Decimal("0.141667") * 3)),
    ]
    assert rows[6] == ["member", "invoice", "minutes", "total", "credit applied", "balance due", "also billed to"]
    assert rows[7][:4] == ["alice", own[alice.pk].label, "33", str(own[alice.pk].total)]
    assert rows[8][:4] == ["bob", own[bob.pk].label, "3", str(own[bob.pk].total)]
    assert dict(row for row in rows[9:] if len(row) == 2) == {
        "minutes": "36",
        "total": str(found.total),
        "credit applied": str(found.credit_applied),
        "balance due": str(found.balance_due),
    }


def test_the_page_reads_the_same_number_of_queries_however_many_members(hold: Hold, staff: User, roles: None) -> None:
    last, now = last_month_start(), database_now()
    people = [make_user(f"member{n}", ["users"]) for n in range(4)]
    for n, person in enumerate(people):
        for day in (1, 2):
            hold(person, now - (last + timedelta(days=day, hours=n)), lasted=timedelta(minutes=2))
    meter.tick()
    small, big = (
        issued(group_of("small", people[0], billed_by=staff)),
        issued(group_of("big", *people[1:], billed_by=staff)),
    )
    client, counts = client_of(staff), []
    for found, lines in ((small, 2), (big, 6)):
        with CaptureQueriesContext(connection) as queries:
            response = client.get(reverse("billing-group-invoice", args=[found.number]))
        assert response.content.decode().count('data-testid="group-invoice-line"') == lines
        counts.append(len(queries))
    assert counts[0] == counts[1] <= 9, counts


def test_the_task_issues_last_months_group_invoices_and_a_rerun_changes_nothing(
    physics: Group, alice: User, hold: Hold
) -> None:
    result = issue_group_invoices.apply().get()
    found = GroupInvoice.objects.get()
    assert result == {"month": f"{invoices.last_month():%Y-%m}", "group_invoices": [found.number]}
    assert issue_group_invoices.apply().get() == result and GroupInvoice.objects.count() == 1


def test_beat_issues_group_invoices_on_the_first_after_the_peoples() -> None:
    people, groups = app.conf.beat_schedule["billing-invoices"], app.conf.beat_schedule["billing-group-invoices"]
    assert groups["task"] == issue_group_invoices.name and isinstance(groups["schedule"], crontab)
    assert groups["schedule"].day_of_month == {1} and groups["schedule"].hour == {0}
    assert min(groups["schedule"].minute) > max(people["schedule"].minute)


def test_the_command_issues_group_invoices_too(physics: Group) -> None:
    out = io.StringIO()
    call_command("issue_invoices", month=f"{invoices.last_month():%Y-%m}", stdout=out)
    found = GroupInvoice.objects.get()
    assert f"1 group invoice(s): {found.label}" in out.getvalue()


def test_only_staff_mark_a_group_as_billed_on_their_page(alice: User, staff: User, roles: None) -> None:
    group = Group.objects.create(name="lab")
    page = reverse("billing-groups")
    assert client_of(alice).get(page).status_code == 403
    assert client_of(alice).post(page, {"group": group.pk, "billing_name": "Lab"}).status_code == 403
    with pytest.raises(PermissionDenied):
        group_invoices.mark(group, "Lab", "", by=alice)
    refused = client_of(staff).post(page, {"group": group.pk, "billing_name": " "})
    assert refused.status_code == 400 and not BilledGroup.objects.exists()
    done = client_of(staff).post(page, {"group": group.pk, "billing_name": "Lab", "billing_email": "lab@example.org"})
    assert done.status_code == 302
    billed = BilledGroup.objects.get()
    assert (billed.group, billed.billing_name, billed.marked_by) == (group, "Lab", staff)
    client_of(staff).post(page, {"group": group.pk, "billing_name": "Lab of physics"})
    assert BilledGroup.objects.get().billing_name == "Lab of physics"  # edited, not a second row
    assert "Lab of physics" in client_of(staff).get(page).content.decode()
    stop = reverse("billing-group-unbill", args=[group.pk])
    assert client_of(alice).post(stop, {"reason": "mine"}).status_code == 403
    client_of(staff).post(stop, {"reason": "the lab closed"})
    assert not BilledGroup.objects.exists()


def test_stopping_billing_a_group_needs_a_reason_and_who_when_and_why_are_kept(staff: User, roles: None) -> None:
    group = Group.objects.create(name="lab")
    page, stop = reverse("billing-groups"), reverse("billing-group-unbill", args=[group.pk])
    client_of(staff).post(page, {"group": group.pk, "billing_name": "Lab", "billing_email": "lab@example.org"})
    client_of(staff).post(page, {"group": group.pk, "billing_name": "Lab of physics"})

    refused = client_of(staff).post(stop, {"reason": "  "})
    assert refused.status_code == 400 and "lab: Say why the group is no longer billed." in refused.content.decode()
    assert BilledGroup.objects.filter(group=group).exists()  # nothing changed
    with pytest.raises(ValidationError):
        group_invoices.unmark(group, by=staff, reason="")

    assert client_of(staff).post(stop, {"reason": "the lab closed"}).status_code == 302
    assert not BilledGroup.objects.exists()
    changes = list(BilledGroupChange.objects.order_by("at", "id"))
    assert [(c.action, c.billing_name, c.by, c.reason) for c in changes] == [
        ("marked", "Lab", staff, ""),
        ("changed", "Lab of physics", staff, ""),
        ("stopped", "Lab of physics", staff, "the lab closed"),
    ]
    assert all(c.group == group and c.at <= timezone.now() for c in changes)
    shown = client_of(staff).get(page).content.decode()
    assert shown.count('data-testid="change-row"') == 3 and "Billing stopped" in shown and "the lab closed" in shown
    again = client_of(staff).post(stop, {"reason": "twice"})  # not billed any more: said, nothing recorded
    assert again.status_code == 400 and "is not billed" in again.content.decode()
    assert BilledGroupChange.objects.count() == 3


def test_a_billed_groups_change_record_is_never_changed_or_deleted(staff: User, roles: None) -> None:
    group = Group.objects.create(name="lab")
    group_invoices.mark(group, "Lab", "", by=staff)
    change = BilledGroupChange.objects.get()
    change.reason = "rewritten"
    with pytest.raises(ValidationError):
        change.save()
    with pytest.raises(ValidationError):
        change.delete()


@postgresql_only
def test_postgresql_refuses_editing_or_deleting_a_billed_groups_change(staff: User, roles: None) -> None:
    group_invoices.mark(Group.objects.create(name="lab"), "Lab", "", by=staff)
    for change in (
        lambda: BilledGroupChange.objects.update(reason="rewritten"),
        lambda: BilledGroupChange.objects.all()._raw_delete(connection.alias),
    ):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            change()
    assert BilledGroupChange.objects.get().reason == ""


def test_staff_mark_a_group_as_billed_in_the_admin(roles: None) -> None:
    root = User.objects.create_superuser("root", "root@example.org", "pw-root-groups")
    group = Group.objects.create(name="lab")
    response = client_of(root).post(
        reverse("admin:billing_billedgroup_add"), {"group": group.pk, "billing_name": "Lab", "billing_email": ""}
    )
    assert response.status_code == 302
    billed = BilledGroup.objects.get()
    assert (billed.group, billed.billing_name, billed.marked_by) == (group, "Lab", root)
    assert client_of(root).get(reverse("admin:billing_groupinvoice_changelist")).status_code == 200
    edited = client_of(root).post(
        reverse("admin:billing_billedgroup_change", args=[billed.pk]), {"billing_name": "Lab 2", "billing_email": ""}
    )
    assert edited.status_code == 302 and BilledGroup.objects.get().billing_name == "Lab 2"
    changes = BilledGroupChange.objects.order_by("at", "id")
    assert [(c.action, c.billing_name, c.by) for c in changes] == [("marked", "Lab", root), ("changed", "Lab 2", root)]
    # Stopping needs a reason: it is done on the portal's page, never by a delete in the admin.
    assert client_of(root).get(reverse("admin:billing_billedgroup_delete", args=[billed.pk])).status_code == 403
    history = client_of(root).get(reverse("admin:billing_billedgroupchange_changelist"))
    assert history.status_code == 200 and "Billed to changed" in history.content.decode()
    assert client_of(root).get(reverse("admin:billing_billedgroupchange_add")).status_code == 403
