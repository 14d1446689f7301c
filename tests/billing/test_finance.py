"""The finance view on a known data set: usages charged by the real meter over a controlled clock, one of
them folded into daily rows, GPU history rows written for idle spend; the figures, the drill-down pages,
the CSVs, who may see them, and billing's counters on /metrics."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import date, timedelta
from decimal import Decimal

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth.models import User
from django.db import connection
from django.db.models import Sum
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

from billing import ledger, meter, reports, rollup
from billing.models import Account, ChargedMinute, Entry, LedgerTransaction, Usage, UsageDay
from billing.reports import Scope
from portal.clock import database_now
from sessions.gpus.allocator import SliceRequest
from sessions.gpus.models import Gpu, Slice
from sessions.metrics.models import GpuMinute
from tests.billing.conftest import A30_SHARE, Hold, clock_moves_on, end_holding
from tests.factories import make_user

H200_3G_SPOT = SliceRequest(kind="mig", profile="3g.71gb", model="H200", market="spot")
TOKEN = "finance-test-token"


@dataclass
class Books:
    old: Usage  # alice's A100, ended a day ago, folded into daily rows
    spot: Usage  # bob's H200 3g spot slice, running
    share: Usage  # alice's A30 share, running
    first: date
    last: date

    @property
    def scope(self) -> Scope:
        return Scope(self.first, self.last)


def history(usage: Usage, minute: int, util_max: float | None, holder: str | None = None) -> None:
    """A GPU history row for the ``minute``-th wall-clock minute of a usage's slice."""
    start = usage.started.replace(second=0, microsecond=0) + timedelta(minutes=minute)
    GpuMinute.objects.create(
        minute=start,
        host="sim",
        gpu_uuid=usage.slice.gpu.uuid,
        device_uuid=usage.slice.device_uuid,
        holder=holder if holder is not None else str(usage.slice.holder),
        samples=60,
        util_mean=util_max,
        util_max=util_max,
    )


@pytest.fixture
def books(hold: Hold, alice: User, bob: User, staff: User) -> Books:
    held = hold(alice, timedelta(minutes=10, seconds=30))
    meter.tick()
    end_holding(held, timedelta(minutes=10, seconds=30))
    meter.charge_holding(held.pk)  # 11 minutes
    clock_moves_on(24 * 60)  # a day passes
    spot, share = (
        hold(bob, timedelta(minutes=3, seconds=20), H200_3G_SPOT),
        hold(alice, timedelta(minutes=2), A30_SHARE),
    )
    meter.tick()  # 4 + 3 minutes
    assert rollup.roll_up(older_than=timedelta(0)).usages == 1
    ledger.grant_credit(bob, "100", by=staff, reason="a start")
    old = Usage.objects.select_related("slice__gpu").get(slice=held)
    for minute, util in enumerate([1.0, 2.0, 0.0, 4.9, 80.0, 50.0, None, 30.0]):
        history(old, minute, util)
    history(old, 11, 0.0)  # after its last charged minute began (minute 10): never idle spend
    history(old, 12, 0.0)
    history(old, 1, 0.0, holder="notebook:999999")  # someone else on the device
    today = database_now().date()
    return Books(
        old,
        Usage.objects.select_related("slice__gpu").get(slice=spot),
        Usage.objects.select_related("slice__gpu").get(slice=share),
        today - timedelta(days=2),
        today,
    )


def finance_client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def amount(usage: Usage, minutes: int) -> Decimal:
    return usage.per_minute * minutes


def revenue_in_ledger() -> Decimal:
    kinds = [Account.Kind.REVENUE_ON_DEMAND, Account.Kind.REVENUE_SPOT]
    return sum((ledger.account_balance(kind) for kind in kinds), Decimal(0))


def csv_rows(response) -> list[list[str]]:  # type: ignore[no-untyped-def]
    assert response.streaming and response["Content-Type"].startswith("text/csv")
    return list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))


@pytest.mark.django_db
def test_the_totals_equal_the_minutes_charged_and_the_ledgers_revenue(books: Books) -> None:
    total = reports.total(books.scope)
    assert total["minutes"] == 11 + 4 + 3
    assert total["amount"] == amount(books.old, 11) + amount(books.spot, 4) + amount(books.share, 3)
    assert total["amount"] == revenue_in_ledger()


@pytest.mark.django_db
def test_revenue_per_day_reads_folded_days_and_minute_rows_alike(books: Books) -> None:
    assert UsageDay.objects.filter(usage=books.old).exists() and not books.old.minutes.exists()
    per_day = reports.revenue_per_day(books.scope)
    assert [row["day"] for row in per_day] == [books.first, books.first + timedelta(days=1), books.last]
    reference = rollup.charged_by_day(books.first, books.last)  # the roll-up's own per-usage reckoning
    assert {row["day"]: (row["minutes"], row["amount"]) for row in per_day if row["minutes"]} == reference
    assert sum(row["minutes"] for row in per_day if row["day"] < books.last) >= 11 - 1  # the old usage, a day back


@pytest.mark.django_db
def test_totals_by_person_group_model_profile_and_market(books: Books, alice: User, bob: User) -> None:
    scope = books.scope
    alice_amount = amount(books.old, 11) + amount(books.share, 3)
    assert {(r["username"], r["minutes"], r["amount"]) for r in reports.by(scope, ["user", "username"])} == {
        ("alice", 14, alice_amount),
        ("bob", 4, amount(books.spot, 4)),
    }
    assert reports.by(scope, ["group"]) == [{"group": "users", "minutes": 18, "amount": reports.total(scope)["amount"]}]
    markets = {r["market"]: (r["minutes"], r["amount"]) for r in reports.by(scope, ["market"])}
    assert markets == {"on_demand": (14, alice_amount), "spot": (4, amount(books.spot, 4))}
    profiles = {
        (r["model"], r["kind"], r["profile"]): r["minutes"] for r in reports.by(scope, ["model", "kind", "profile"])
    }
    assert profiles == {
        (books.old.slice.gpu.model_name, "whole", ""): 11,
        (books.spot.slice.gpu.model_name, "mig", "3g.71gb"): 4,
        (books.share.slice.gpu.model_name, "shared", ""): 3,
    }
    only_bob = Scope(books.first, books.last, user=bob.pk)
    assert reports.total(only_bob) == {"minutes": 4, "amount": amount(books.spot, 4)}
    assert reports.total(Scope(books.first, books.last, group="")) == {"minutes": 0, "amount": Decimal(0)}


@pytest.mark.django_db
def test_a_range_that_misses_the_usages_has_nothing(books: Books) -> None:
    before = Scope(books.first - timedelta(days=30), books.first - timedelta(days=20))
    assert reports.total(before) == {"minutes": 0, "amount": Decimal(0)}
    assert reports.idle_spend(before) == []


@pytest.mark.django_db
def test_idle_spend_counts_billed_minutes_under_the_threshold_only(books: Books, settings) -> None:  # type: ignore[no-untyped-def]
    settings.IDLE_GPU_UTIL_PERCENT = 5
    # Minutes 0-3 stayed under 5 %; 4, 5 and 7 were busy; 6 reported nothing; 11 and 12 came after the last;
    # the other holder's quiet minute is not this usage's.
    assert reports.idle_spend(books.scope) == [
        {"user": books.old.owner_id, "username": "alice", "minutes": 4, "amount": amount(books.old, 4)}
    ]
    assert reports.idle_total(books.scope) == {"minutes": 4, "amount": amount(books.old, 4)}
    settings.IDLE_GPU_UTIL_PERCENT = 60
    assert reports.idle_total(books.scope)["minutes"] == 6


@pytest.mark.django_db
def test_fleet_utilisation_counts_slices_by_their_share_of_a_gpu(books: Books) -> None:
    now = database_now()
    rows = {row["model"]: row for row in reports.fleet_utilisation(books.scope, now)}
    hours = Decimal((now - books.scope.since).total_seconds()) / 3600
    a100 = rows[books.old.slice.gpu.model_name]
    assert a100["gpus"] == Gpu.objects.filter(model_name=a100["model"]).count() == 8
    assert a100["billed_hours"] == (Decimal(11) / 60).quantize(Decimal("0.01"))
    assert a100["available_hours"] == (8 * hours).quantize(Decimal("0.01"))
    h200 = rows[books.spot.slice.gpu.model_name]
    assert h200["billed_hours"] == (Decimal(4) * Decimal(3) / 7 / 60).quantize(Decimal("0.01"))


@pytest.mark.django_db
def test_negative_balances_list_the_wallets_below_zero(books: Books) -> None:
    assert [(row["username"], row["balance"]) for row in reports.negative_balances()] == [
        ("alice", -(amount(books.old, 11) + amount(books.share, 3)))
    ]


@pytest.mark.django_db
def test_people_without_the_finance_permission_get_403_and_no_link(books: Books, alice: User, staff: User) -> None:
    for person in (alice, staff):
        client = finance_client(person)
        for url in (
            reverse("billing-finance"),
            reverse("billing-finance-usages"),
            reverse("billing-finance-usage", args=[books.old.pk]),
            reverse("billing-finance") + "?format=csv&table=users",
        ):
            assert client.get(url).status_code == 403, (person, url)
        assert reverse("billing-finance") not in client.get(reverse("dashboard")).content.decode()


@pytest.mark.django_db
def test_the_finance_page_shows_the_figures_chart_data_and_drill_links(books: Books, billing_user: User) -> None:
    client = finance_client(billing_user)
    assert reverse("billing-finance") in client.get(reverse("dashboard")).content.decode()
    page = client.get(reverse("billing-finance"), {"start": str(books.first), "end": str(books.last)})
    assert page.status_code == 200
    body = page.content.decode()
    total = reports.total(books.scope)["amount"]
    assert f"{total:.2f}" in body and 'id="revenue-data"' in body and "data-revenue-chart" in body
    assert len(page.context["chart"]["t"]) == 3
    for name in ("per_day", "users", "top_users", "groups", "models", "profiles", "markets", "fleet", "idle"):
        assert f'data-table="{name}"' in body
    day_link = f"{reverse('billing-finance-usages')}?start={books.last}&amp;end={books.last}"
    assert day_link in body


@pytest.mark.django_db
def test_the_default_range_is_the_last_30_days(books: Books, billing_user: User) -> None:
    scope = finance_client(billing_user).get(reverse("billing-finance")).context["scope"]
    assert (scope.first, scope.last) == (books.last - timedelta(days=29), books.last)


@pytest.mark.django_db
def test_a_backwards_range_is_refused(billing_user: User) -> None:
    response = finance_client(billing_user).get(
        reverse("billing-finance"), {"start": "2026-03-02", "end": "2026-03-01"}
    )
    assert response.status_code == 400 and "ends before it begins" in response.content.decode()


@pytest.mark.django_db
def test_drilling_down_a_person_lists_their_usages_and_the_ledger_entries(books: Books, billing_user: User) -> None:
    client = finance_client(billing_user)
    query = {"start": str(books.first), "end": str(books.last), "user": str(books.old.owner_id)}
    page = client.get(reverse("billing-finance-usages"), query)
    usages_table, entries_table = page.context["tables"]
    assert [row[0] for row in usages_table.rows] == [books.share.pk, books.old.pk]
    assert {row[0]: row[8] for row in usages_table.rows} == {books.share.pk: 3, books.old.pk: 11}
    # The share's minutes are still rows, so the transactions that charged them are listed, both sides.
    wallet_lines = [row for row in entries_table.rows if row[4] == "wallet of alice"]
    assert sum(row[5] for row in wallet_lines) == -amount(books.share, 3)
    assert sum(row[5] for row in entries_table.rows) == 0
    csv_table = csv_rows(client.get(reverse("billing-finance-usages"), {**query, "format": "csv", "table": "usages"}))
    assert csv_table[0][:2] == ["Usage", "Person"] and len(csv_table) == 3


@pytest.mark.django_db
def test_a_usage_page_shows_each_charged_minute_and_its_gpu_history(books: Books, billing_user: User) -> None:
    client = finance_client(billing_user)
    for minute, util in enumerate([1.0, 90.0, None, 2.0]):
        history(books.spot, minute, util)
    spot = client.get(reverse("billing-finance-usage", args=[books.spot.pk]))
    minutes = spot.context["tables"][0]
    assert [row[0] for row in minutes.rows] == [0, 1, 2, 3]
    assert [row[3] for row in minutes.rows] == ["idle", "busy", None, "idle"]
    # The same minutes as the report's idle spend.
    by_usage = {row["usage"]: row["minutes"] for row in reports.idle_spend(books.scope, ["usage"])}
    assert by_usage[books.spot.pk] == 2
    assert all(row[5] == books.spot.per_minute for row in minutes.rows)
    rows = csv_rows(
        client.get(reverse("billing-finance-usage", args=[books.spot.pk]), {"format": "csv", "table": "minutes"})
    )
    assert rows[0] == ["Minute", "Began", "GPU util max %", "Idle", "Transaction", "Amount"]
    assert [row[0] for row in rows[1:]] == ["0", "1", "2", "3"] and rows[1][5] == str(books.spot.per_minute)
    folded = client.get(reverse("billing-finance-usage", args=[books.old.pk]))
    days = folded.context["tables"][1]
    assert sum(row[2] for row in days.rows) == 11 and folded.context["tables"][0].rows == []


@pytest.mark.django_db
def test_every_overview_table_comes_as_csv_with_exact_amounts(books: Books, billing_user: User) -> None:
    client = finance_client(billing_user)
    query = {"start": str(books.first), "end": str(books.last), "format": "csv"}
    users = csv_rows(client.get(reverse("billing-finance"), {**query, "table": "users"}))
    assert users[0] == ["Person", "Minutes", "Amount"]
    assert {row[0]: row[2] for row in users[1:]} == {  # as text: exact, six decimals
        "alice": str(amount(books.old, 11) + amount(books.share, 3)),
        "bob": str(amount(books.spot, 4)),
    }
    for name in ("per_day", "top_users", "groups", "models", "profiles", "markets", "fleet", "idle", "negative"):
        assert len(csv_rows(client.get(reverse("billing-finance"), {**query, "table": name}))) >= 2, name
    assert client.get(reverse("billing-finance"), {**query, "table": "nope"}).status_code == 400


@pytest.mark.django_db
def test_metrics_count_billed_minutes_and_revenue_by_model_kind_and_market(
    books: Books,
    client: Client,
    settings,  # type: ignore[no-untyped-def]
) -> None:
    settings.METRICS_TOKEN = TOKEN
    text = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).content.decode()
    samples = {
        (s.name, s.labels["model"], s.labels["kind"], s.labels["market"]): s.value
        for family in text_string_to_metric_families(text)
        if family.name in ("portal_billed_minutes", "portal_revenue")
        for s in family.samples
        if s.name.endswith("_total")
    }
    a100, h200 = books.old.slice.gpu.model_name, books.spot.slice.gpu.model_name
    assert samples[("portal_billed_minutes_total", a100, "whole", "on_demand")] == 11
    assert samples[("portal_billed_minutes_total", h200, "mig", "spot")] == 4
    assert samples[("portal_revenue_total", h200, "mig", "spot")] == pytest.approx(float(amount(books.spot, 4)))
    revenue = sum(v for key, v in samples.items() if key[0] == "portal_revenue_total")
    assert revenue == pytest.approx(float(revenue_in_ledger()))
    assert Slice.objects.aggregate(n=Sum("usage__billed_minutes"))["n"] == 18


@pytest.mark.django_db
def test_every_billing_model_is_in_the_admin_and_the_ledger_is_read_only_there(books: Books) -> None:
    admin_user = User.objects.create_superuser("root", "root@example.org", "pw-root-finance")
    client = finance_client(admin_user)
    for model in apps.get_app_config("billing").get_models():
        if not model._meta.managed:
            continue  # FinanceAccess: a permission, no table
        assert admin.site.is_registered(model), model
        changelist = reverse(f"admin:billing_{model._meta.model_name}_changelist")
        assert client.get(changelist).status_code == 200, model
    for model in (LedgerTransaction, Entry, Account, ChargedMinute, UsageDay, Usage):
        assert client.get(reverse(f"admin:billing_{model._meta.model_name}_add")).status_code == 403, model
    entry = Entry.objects.first()
    assert entry is not None
    change = client.post(reverse("admin:billing_entry_change", args=[entry.pk]), {"amount": "1"})
    assert change.status_code == 403
    assert Entry.objects.get(pk=entry.pk).amount == entry.amount


@pytest.mark.django_db
def test_the_finance_pages_queries_do_not_grow_with_the_number_of_usages(
    hold: Hold, alice: User, bob: User, billing_user: User
) -> None:
    client = finance_client(billing_user)

    def queries() -> tuple[int, int]:
        with CaptureQueriesContext(connection) as overview:
            assert client.get(reverse("billing-finance")).status_code == 200
        with CaptureQueriesContext(connection) as drill:
            assert client.get(reverse("billing-finance-usages")).status_code == 200
        return len(overview.captured_queries), len(drill.captured_queries)

    hold(alice, timedelta(minutes=3))
    meter.tick()
    few = queries()
    for owner in (alice, bob, alice, bob, alice, bob):
        hold(owner, timedelta(minutes=2))
    hold(bob, timedelta(minutes=1), A30_SHARE)
    clock_moves_on(1)
    meter.tick()
    assert queries() == few


@pytest.mark.django_db
def test_groups_count_a_person_in_each_and_drill_down_to_people_in_none(
    books: Books, billing_user: User, hold: Hold
) -> None:
    erin = make_user("erin", [])
    hold(erin, timedelta(seconds=30))
    meter.tick()
    groups = {row["group"]: row["minutes"] for row in reports.by(books.scope, ["group"])}
    assert groups == {"users": 18, None: 1}
    client = finance_client(billing_user)
    page = client.get(reverse("billing-finance"), {"start": str(books.first), "end": str(books.last)})
    group_rows = next(table for table in page.context["tables"] if table.name == "groups")
    link = dict(zip([row[0] for row in group_rows.rows], group_rows.links, strict=True))["(none)"]
    assert link is not None
    drill = client.get(link)
    assert [row[1] for row in drill.context["tables"][0].rows] == ["erin"]
    users = client.get(reverse("billing-finance-usages"), {"start": str(books.first), "group": "users"})
    assert {row[1] for row in users.context["tables"][0].rows} == {"alice", "bob"}


@pytest.mark.django_db
def test_the_idle_spend_figure_drills_down_to_the_usages_with_idle_minutes_and_their_ledger(
    books: Books,
    billing_user: User,
    settings,  # type: ignore[no-untyped-def]
) -> None:
    settings.IDLE_GPU_UTIL_PERCENT = 5
    history(books.spot, 0, 1.0)  # bob's spot slice: its first minute idle too; its minutes are still rows
    client = finance_client(billing_user)
    query = {"start": str(books.first), "end": str(books.last)}
    page = client.get(reverse("billing-finance"), query)
    idle_link = page.context["idle_usages"]
    assert f'href="{idle_link.replace("&", "&amp;")}"' in page.content.decode()  # the figure's link
    idle_table = next(table for table in page.context["tables"] if table.name == "idle")
    person_links = dict(zip([row[0] for row in idle_table.rows], idle_table.links, strict=True))
    assert "idle=1" in person_links["bob"]

    drill = client.get(idle_link)
    usages_table, entries_table = drill.context["tables"]
    assert sorted(row[0] for row in usages_table.rows) == sorted([books.old.pk, books.spot.pk])  # not the share
    assert {row[0]: row[10] for row in usages_table.rows} == {books.old.pk: 4, books.spot.pk: 1}
    expected = amount(books.old, 4) + amount(books.spot, 1)
    assert drill.context["total"] == {"minutes": 5, "amount": expected} == reports.idle_total(books.scope)
    assert "5 idle minutes" in drill.content.decode()
    # The entries that charged the idle usages' minute rows (the spot's), never the share's.
    wallets = {row[4] for row in entries_table.rows if row[4].startswith("wallet")}
    assert wallets == {"wallet of bob"} and sum(row[5] for row in entries_table.rows) == 0

    bobs = client.get(person_links["bob"]).context["tables"][0]
    assert [row[0] for row in bobs.rows] == [books.spot.pk]


@pytest.mark.django_db
def test_every_drill_down_table_comes_as_csv_too(books: Books, billing_user: User) -> None:
    client = finance_client(billing_user)
    query = {"start": str(books.first), "end": str(books.last), "format": "csv"}
    drill = reverse("billing-finance-usages")
    ledger_rows = csv_rows(client.get(drill, {**query, "table": "ledger"}))
    assert ledger_rows[0] == ["Transaction", "Posted", "Kind", "Memo", "Account", "Amount"]
    assert len(ledger_rows) > 2 and sum(Decimal(row[5]) for row in ledger_rows[1:]) == 0
    usage_page = reverse("billing-finance-usage", args=[books.old.pk])
    days = csv_rows(client.get(usage_page, {"format": "csv", "table": "days"}))
    assert days[0] == ["Day", "First minute", "Minutes", "Amount"] and sum(int(row[2]) for row in days[1:]) == 11
    spot_page = reverse("billing-finance-usage", args=[books.spot.pk])
    spot_ledger = csv_rows(client.get(spot_page, {"format": "csv", "table": "ledger"}))
    assert len(spot_ledger) == 3 and sum(Decimal(row[5]) for row in spot_ledger[1:]) == 0  # wallet and revenue
    for page, names in ((drill, ("usages", "ledger")), (usage_page, ("minutes", "days", "ledger"))):
        body = client.get(page, {"start": str(books.first), "end": str(books.last)}).content.decode()
        for name in names:
            assert f'data-testid="csv-{name}"' in body, (page, name)
