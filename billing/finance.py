"""The finance view for people with ``billing.view_finance``: the figures of billing/reports.py over a
range of days, each row a link to the usages and ledger entries behind it, down to one usage's minutes;
every table also as CSV (``?format=csv&table=<name>``), streamed."""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib.auth.decorators import permission_required
from django.http import HttpRequest, HttpResponseBadRequest, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import get_object_or_404, render
from django.urls import reverse

from billing import money, reports
from billing.models import ChargedMinute, Entry, LedgerTransaction, Market, Usage
from billing.reports import Scope
from portal.clock import database_now
from sessions.metrics.models import GpuMinute

MAX_DAYS = 366
DEFAULT_DAYS = 30
TOP_USERS = 10
LISTED = 500  # rows of a drill-down page; the CSV has them all
NO_GROUP = "(none)"
finance_only = permission_required("billing.view_finance", raise_exception=True)


@dataclass
class Table:
    """One table of figures: raw values for the CSV, shown with two decimals where ``money`` says so."""

    name: str
    title: str
    headers: Sequence[str]
    rows: Sequence[Sequence[Any]]
    money: set[int] = field(default_factory=set)  # columns holding an amount
    links: list[str | None] = field(default_factory=list)  # a drill-down per row

    def shown(self) -> Iterator[tuple[list[str], str | None]]:
        links = self.links or [None] * len(self.rows)
        for row, link in zip(self.rows, links, strict=True):
            yield [self._cell(n, value) for n, value in enumerate(row)], link

    def _cell(self, column: int, value: Any) -> str:
        if value is None:
            return "—"
        if column in self.money and isinstance(value, Decimal):
            return money.shown(value)
        if isinstance(value, datetime):
            return f"{value:%Y-%m-%d %H:%M:%S}"
        return str(value)


class RangeForm(forms.Form):
    start = forms.DateField(label="From", required=False, widget=forms.DateInput(attrs={"type": "date"}))
    end = forms.DateField(label="To", required=False, widget=forms.DateInput(attrs={"type": "date"}))
    user = forms.IntegerField(required=False, widget=forms.HiddenInput)
    group = forms.CharField(required=False, widget=forms.HiddenInput)
    model = forms.CharField(required=False, widget=forms.HiddenInput)
    kind = forms.CharField(required=False, widget=forms.HiddenInput)
    profile = forms.CharField(required=False, widget=forms.HiddenInput)
    market = forms.CharField(required=False, widget=forms.HiddenInput)
    idle = forms.BooleanField(required=False, widget=forms.HiddenInput)  # a drill-down of idle spend

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        today = database_now().date()
        data["end"] = data.get("end") or today
        data["start"] = data.get("start") or data["end"] - timedelta(days=DEFAULT_DAYS - 1)
        if data["start"] > data["end"]:
            raise forms.ValidationError("The range ends before it begins.")
        if (data["end"] - data["start"]).days >= MAX_DAYS:
            raise forms.ValidationError(f"At most {MAX_DAYS} days at once.")
        return data

    def scope(self) -> Scope:
        d = self.cleaned_data
        group = None if not d["group"] else ("" if d["group"] == NO_GROUP else d["group"])
        return Scope(d["start"], d["end"], d["user"], group, d["model"], d["kind"], d["profile"], d["market"])


def _query(scope: Scope, **narrower: Any) -> str:
    """The query string of a scope, narrowed (a day, a person, a model ..., ``idle=1``) for a drill-down link."""
    params = {"start": scope.first, "end": scope.last, "user": scope.user, "model": scope.model}
    params |= {"kind": scope.kind, "profile": scope.profile, "market": scope.market}
    params["group"] = NO_GROUP if scope.group == "" else scope.group
    params |= narrower
    return urlencode({key: value for key, value in params.items() if value not in (None, "")})


def _drill(scope: Scope, **narrower: Any) -> str:
    return f"{reverse('billing-finance-usages')}?{_query(scope, **narrower)}"


def _scope_or_400(request: HttpRequest) -> tuple[RangeForm, Scope | None]:
    form = RangeForm(request.GET)
    return form, (form.scope() if form.is_valid() else None)


def _respond(request: HttpRequest, template: str, tables: list[Table], context: dict[str, Any]) -> HttpResponseBase:
    """The page, or one of its tables as CSV when ``?format=csv&table=<name>`` asks."""
    if request.GET.get("format") == "csv":
        wanted = next((table for table in tables if table.name == request.GET.get("table")), None)
        if wanted is None:
            return HttpResponseBadRequest(f"Tables: {', '.join(table.name for table in tables)}.")
        return csv_response(wanted, context.get("csv_name", "finance"))
    return render(request, template, {**context, "tables": tables})


class _Echo:
    def write(self, value: str) -> str:
        return value


def csv_response(table: Table, stem: str) -> StreamingHttpResponse:
    """A table as CSV, written row by row as it streams; amounts exact (six decimals)."""
    writer = csv.writer(_Echo())
    lines = (writer.writerow(row) for row in [list(table.headers), *table.rows])
    response = StreamingHttpResponse(lines, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{stem}-{table.name}.csv"'
    return response


@finance_only
def overview(request: HttpRequest) -> HttpResponseBase:
    """Staff with the finance permission: revenue per day, totals by every dimension, fleet, idle spend."""
    form, scope = _scope_or_400(request)
    if scope is None:
        return render(request, "billing/finance.html", {"form": form, "tables": []}, status=400)
    form = RangeForm({**request.GET.dict(), "start": scope.first, "end": scope.last})  # show the range used
    per_day = reports.revenue_per_day(scope)
    tables = overview_tables(scope, per_day)
    chart = {
        "t": [datetime.combine(row["day"], time()).timestamp() for row in per_day],
        "amount": [float(row["amount"]) for row in per_day],  # the chart's points only; the tables are exact
        "links": [_drill(scope, start=row["day"], end=row["day"]) for row in per_day],
    }
    context = {
        "form": form,
        "scope": scope,
        "chart": chart,
        "total": reports.total(scope),
        "idle": reports.idle_total(scope),
        "currency": settings.CURRENCY,
        "everything": _drill(scope),
        "idle_usages": _drill(scope, idle=1),
        "csv_name": f"finance-{scope.first}-{scope.last}",
    }
    return _respond(request, "billing/finance.html", tables, context)


def rows(found: list[dict[str, Any]], keys: Sequence[str]) -> list[list[Any]]:
    return [[row[key] for key in keys] for row in found]


def overview_tables(scope: Scope, per_day: list[dict[str, Any]]) -> list[Table]:
    users = reports.by(scope, ["user", "username"])
    figures = ["minutes", "amount"]
    groups = reports.by(scope, ["group"])
    profiles = reports.by(scope, ["model", "kind", "profile"])
    markets = reports.by(scope, ["market"])
    models = reports.by(scope, ["model"])
    fleet = reports.fleet_utilisation(scope, database_now())
    idle = reports.idle_spend(scope)
    negative = reports.negative_balances()
    # Half-width tables in pairs, the wide ones (profiles, fleet, per day) on rows of their own.
    return [
        Table("users", "By person", ["Person", "Minutes", "Amount"], rows(users, ["username", *figures]), {2},
              [_drill(scope, user=r["user"]) for r in users]),
        Table("top_users", f"Top {TOP_USERS} people", ["Person", "Minutes", "Amount"],
              rows(users[:TOP_USERS], ["username", *figures]), {2},
              [_drill(scope, user=r["user"]) for r in users[:TOP_USERS]]),
        Table("groups", "By group (a person in several groups counts in each)", ["Group", "Minutes", "Amount"],
              [[r["group"] or NO_GROUP, r["minutes"], r["amount"]] for r in groups], {2},
              [_drill(scope, group=r["group"] or NO_GROUP) for r in groups]),
        Table("models", "By GPU model", ["GPU model", "Minutes", "Amount"], rows(models, ["model", *figures]), {2},
              [_drill(scope, model=r["model"]) for r in models]),
        Table("markets", "On-demand and spot", ["Market", "Minutes", "Amount"],
              [[Market(r["market"]).label, r["minutes"], r["amount"]] for r in markets],
              {2}, [_drill(scope, market=r["market"]) for r in markets]),
        Table("idle", "Idle spend by person", ["Person", "Idle minutes", "Amount"],
              rows(idle, ["username", *figures]), {2}, [_drill(scope, user=r["user"], idle=1) for r in idle]),
        Table("profiles", "By profile", ["GPU model", "Kind", "Profile", "Minutes", "Amount"],
              rows(profiles, ["model", "kind", "profile", *figures]), {4},
              [_drill(scope, model=r["model"], kind=r["kind"], profile=r["profile"]) for r in profiles]),
        Table("fleet", "Fleet utilisation: GPU-hours billed against the fleet's",
              ["GPU model", "GPUs", "GPU-hours billed", "GPU-hours available", "Utilisation %"],
              rows(fleet, ["model", "gpus", "billed_hours", "available_hours", "percent"]), set(),
              [_drill(scope, model=r["model"]) for r in fleet]),
        Table("negative", "Negative balances (now)", ["Person", "Balance"],
              rows(negative, ["username", "balance"]), {1}, [_drill(scope, user=r["user"]) for r in negative]),
        Table("per_day", "Revenue per day", ["Day", "Minutes", "Amount"], rows(per_day, ["day", *figures]), {2},
              [_drill(scope, start=r["day"], end=r["day"]) for r in per_day]),
    ]  # fmt: skip


@finance_only
def usages(request: HttpRequest) -> HttpResponseBase:
    """What a figure is made of: its usages (minutes and amount within the scope) and ledger entries; with
    ``idle=1``, idle spend's: the usages with idle minutes, and their idle minutes and amount as the total."""
    form, scope = _scope_or_400(request)
    if scope is None:
        return HttpResponseBadRequest("Bad range.")
    idle_only = bool(form.cleaned_data["idle"])
    figures = {row["usage"]: row for row in reports.billed(scope, ["usage"])}
    idle = {row["usage"]: row for row in reports.idle_spend(scope, ["usage"])}
    wanted = idle if idle_only else figures
    found = Usage.objects.filter(pk__in=wanted).select_related("owner", "slice__gpu").order_by("-started", "-pk")
    listed = [
        [u.pk, u.owner.username, u.slice.gpu.model_name, u.slice.kind, u.slice.profile, u.market, u.started,
         u.ended, figures[u.pk]["minutes"], figures[u.pk]["amount"], idle.get(u.pk, {}).get("minutes", 0)]
        for u in found if u.pk in figures
    ]  # fmt: skip
    table = Table(
        "usages",
        "Usages",
        ["Usage", "Person", "GPU model", "Kind", "Profile", "Market", "Started", "Ended", "Minutes", "Amount",
         "Idle minutes"],
        listed, {9}, [reverse("billing-finance-usage", args=[row[0]]) + f"?{_query(scope)}" for row in listed],
    )  # fmt: skip
    minutes = reports.minute_rows(scope)
    if idle_only:
        minutes = minutes.filter(usage__in=list(idle))
    transactions = LedgerTransaction.objects.filter(pk__in=minutes.values("transaction_id"))
    tables = [table, entries_table(transactions)]
    total = _idle_total(idle) if idle_only else reports.total(scope)
    context = {"form": form, "scope": scope, "total": total, "idle_only": idle_only, "csv_name": "finance-usages"}
    context["currency"] = settings.CURRENCY
    context["listed"] = LISTED
    return _respond(request, "billing/finance_usages.html", tables, context)


def _idle_total(idle: dict[int, dict[str, Any]]) -> dict[str, Any]:
    return {
        "minutes": sum(row["minutes"] for row in idle.values()),
        "amount": sum((row["amount"] for row in idle.values()), Decimal(0)),
    }


def entries_table(transactions: Any) -> Table:
    """The ledger entries of some transactions, every account's side."""
    entries = (
        Entry.objects.filter(transaction__in=transactions)
        .select_related("transaction", "account__user")
        .order_by("transaction__posted_at", "transaction_id", "id")
    )
    rows = [
        [e.transaction_id, e.transaction.posted_at, e.transaction.get_kind_display(), e.transaction.memo,
         f"wallet of {e.account.user.username}" if e.account.user else str(e.account), e.amount]
        for e in entries
    ]  # fmt: skip
    headers = ["Transaction", "Posted", "Kind", "Memo", "Account", "Amount"]
    return Table("ledger", "Ledger entries that charged these minutes", headers, rows, {5})


@finance_only
def usage_detail(request: HttpRequest, usage_id: int) -> HttpResponseBase:
    """One usage: each charged minute with its GPU utilisation (idle or not), its folded days, its ledger."""
    usage = get_object_or_404(Usage.objects.select_related("owner", "slice__gpu", "price"), pk=usage_id)
    tables = usage_tables(usage)
    context = {"usage": usage, "back": f"{reverse('billing-finance-usages')}?{request.GET.urlencode()}"}
    context |= {"csv_name": f"usage-{usage.pk}", "threshold": settings.IDLE_GPU_UTIL_PERCENT}
    context["charged"] = money.shown(usage.per_minute * usage.billed_minutes)
    return _respond(request, "billing/finance_usage.html", tables, context)


def usage_tables(usage: Usage) -> list[Table]:
    held = usage.slice
    history = GpuMinute.objects.filter(device_uuid=held.device_uuid, holder=str(held.holder or ""))
    if usage.ended is not None:
        history = history.filter(minute__lt=usage.ended)
    util = dict(
        history.filter(minute__gte=usage.started.replace(second=0, microsecond=0)).values_list("minute", "util_max")
    )
    threshold = float(settings.IDLE_GPU_UTIL_PERCENT)
    rows = []
    for charged in ChargedMinute.objects.filter(usage=usage).order_by("minute"):
        began = usage.started + timedelta(minutes=charged.minute)
        seen = util.get(began.replace(second=0, microsecond=0))
        idle = None if seen is None else ("idle" if seen < threshold else "busy")
        rows.append([charged.minute, began, seen, idle, charged.transaction_id, usage.per_minute])
    minutes = Table("minutes", "Charged minutes", ["Minute", "Began", "GPU util max %", "Idle", "Transaction",
                                                   "Amount"], rows)  # fmt: skip
    days = Table(
        "days",
        "Folded days (minute rows rolled up)",
        ["Day", "First minute", "Minutes", "Amount"],
        [[d.day, d.first_minute, d.minutes, d.amount] for d in usage.days.order_by("day")],
        {3},
    )
    transactions = LedgerTransaction.objects.filter(pk__in=usage.minutes.values("transaction_id"))
    return [minutes, days, entries_table(transactions)]
