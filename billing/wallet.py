"""A person's own money: the billing page (balance, burn, time left, what runs and its cost rising, usage
history with filters, the budget and its alerts), the live cost of one holding, and the notices the
dashboard shows. Nobody reaches anyone else's: another person's holding answers 404.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db.models import F, QuerySet, Sum
from django.db.models.functions import TruncDate
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from billing import budgets, costs, credit, ledger, money, prices
from billing.launch import duration
from billing.models import Account, Entry, LedgerTransaction, Market, Usage
from portal.http import PortalRequest
from sessions import access
from sessions.gpus import catalog
from sessions.gpus.models import Slice

PAGE = "billing/account.html"
COST = "billing/partials/holding_cost.html"
NOTICES = "billing/partials/notices.html"
HISTORY_ROWS = 100
MONEY_IN_ROWS = 20
LONGEST_RANGE_DAYS = 366


class HistoryFilter(forms.Form):
    start = forms.DateField(required=False, label="From", widget=forms.DateInput(attrs={"type": "date"}))
    end = forms.DateField(required=False, label="To", widget=forms.DateInput(attrs={"type": "date"}))
    kind = forms.ChoiceField(required=False, choices=[("", "Any kind"), *Slice.Kind.choices])
    model = forms.ChoiceField(required=False, label="GPU")

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        field = self.fields["model"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [("", "Any GPU"), *((name, name) for name in catalog.models())]

    def clean(self) -> dict[str, object]:
        data = super().clean() or {}
        today = timezone.now().astimezone(UTC).date()
        data["end"] = data.get("end") or today
        data["start"] = data.get("start") or data["end"] - timedelta(days=29)
        if data["start"] > data["end"]:
            raise ValidationError("'From' is after 'To'.")
        if (data["end"] - data["start"]).days >= LONGEST_RANGE_DAYS:
            raise ValidationError(f"Pick a range of at most {LONGEST_RANGE_DAYS} days.")
        return data


class BudgetForm(forms.Form):
    monthly = forms.CharField(label="Monthly budget", max_length=20, help_text="Alerts at 50, 80 and 100 %.")


@dataclass(frozen=True)
class Day:
    day: object
    amount: Decimal


@dataclass(frozen=True)
class HistoryRow:
    """One usage in the history: its charged minutes, or, before the meter's first tick has opened it, the
    minutes due so far by its recorded moments (``charged`` False)."""

    held: Slice
    started: datetime
    market: str
    minutes: int
    per_minute: Decimal
    running: bool
    charged: bool = True

    @property
    def cost(self) -> Decimal:
        return self.per_minute * self.minutes

    @classmethod
    def of_usage(cls, usage: Usage) -> HistoryRow:
        market = usage.get_market_display()
        return cls(usage.slice, usage.started, market, usage.billed_minutes, usage.per_minute, usage.open)

    @classmethod
    def of_holding(cls, found: costs.Running) -> HistoryRow:
        held = found.held
        assert held.held_from is not None
        market = Market(prices.market_of(held)).label
        running = costs.ended_at(held) is None
        return cls(held, held.held_from, market, found.minutes, found.per_minute, running, charged=False)


def _person(request: PortalRequest) -> User:
    assert isinstance(request.user, User)
    return request.user


@login_required
@require_GET
def account(request: PortalRequest) -> HttpResponse:
    user = _person(request)
    history = HistoryFilter(request.GET)
    context = {
        **_summary(user),
        **_history(user, history),
        "budget_form": BudgetForm(),
        "money_in": _money_in(user),
    }
    target = request.htmx.target if request.htmx else None
    if target in ("wallet-live", "history"):
        return render(request, f"{PAGE}#{target}", context)
    return render(request, PAGE, context)


def _summary(user: User) -> dict[str, object]:
    wallet = costs.wallet(user)
    budget = budgets.budget_for(user)
    month = budgets.month_of(timezone.now())
    spent = budgets.spent(budget, month) if budget else None
    left = wallet.time_left
    return {
        "wallet": wallet,
        "balance": money.shown(wallet.balance),
        "burn": money.shown(wallet.burn_per_hour),
        "time_left": duration(left) if left is not None else None,
        "time_left_hours": round(left.total_seconds() / 3600, 2) if left is not None else None,
        "running": [(r, money.shown(r.per_hour)) for r in wallet.running],
        "costs": {r.held.pk: r for r in wallet.running},  # each row's live cost, without asking again
        "budget": budget,
        "budget_monthly": money.shown(budget.monthly) if budget else "",
        "spent": money.shown(spent) if spent is not None else "",
        "spent_value": spent,
        "budget_low": str(budget.monthly / 2) if budget else "",
        "budget_high": str(budget.monthly * 4 / 5) if budget else "",
        "alerts": list(budgets.alerts_for(user, month)),
        "month": month,
    }


def _money_in(user: User) -> list[tuple[Entry, str]]:
    """The latest of what came into the person's wallet other than per-minute charges, with why: credit given
    or topped up, credit notes, reversals, and minutes charged past a holding's end given back."""
    entries = (
        Entry.objects.filter(account__kind=Account.Kind.WALLET, account__user=user)
        .exclude(transaction__kind=LedgerTransaction.Kind.USAGE)
        .select_related("transaction")
        .order_by("-transaction__posted_at", "-transaction_id")
    )
    return [(entry, money.shown(entry.amount)) for entry in entries[:MONEY_IN_ROWS]]


def _history(user: User, history: HistoryFilter) -> dict[str, object]:
    if not history.is_valid():
        return {"history": history, "usages": [], "days": [], "history_total": money.shown(Decimal(0))}
    data = history.cleaned_data
    start = datetime.combine(data["start"], time.min, tzinfo=UTC)
    end = datetime.combine(data["end"], time.min, tzinfo=UTC) + timedelta(days=1)
    # Holdings the meter has not opened yet are read first: one it opens meanwhile is then listed once, as its usage.
    holdings = Slice.objects.filter(owner=user, held_from__gte=start, held_from__lt=end, metered=False)
    unopened = list(_filtered(holdings, data).select_related("gpu__host"))  # the cost names the GPU by its host
    usages = Usage.objects.filter(owner=user, started__gte=start, started__lt=end)
    usages = _filtered(usages, data, through="slice__")
    charged = [HistoryRow.of_usage(usage) for usage in usages.select_related("slice__gpu")]
    rows = sorted(charged + _not_yet_charged(unopened, {row.held.pk for row in charged}), key=_newest_first)
    total = sum((row.cost for row in rows), Decimal(0))
    days = _days(usages, rows)
    shown = {key: data.get(key) or "" for key in ("start", "end", "kind", "model")}  # the inputs show what was used
    return {
        "history": HistoryFilter(shown),
        "usages": [(row, money.shown(row.cost)) for row in rows[:HISTORY_ROWS]],
        "more_rows": len(rows) > HISTORY_ROWS,
        "not_yet_charged": any(not row.charged for row in rows[:HISTORY_ROWS]),
        "days": days,
        "days_max": max((d.amount for d, _ in days), default=Decimal(0)),
        "history_total": money.shown(total),
    }


def _filtered(found: QuerySet[Any], data: dict[str, Any], through: str = "") -> QuerySet[Any]:
    """The history's kind and GPU filters, on slices or (``through="slice__"``) on usages."""
    if data.get("kind"):
        found = found.filter(**{f"{through}kind": data["kind"]})
    if data.get("model"):
        found = found.filter(**{f"{through}gpu__model_name": data["model"]})
    return found


def _newest_first(row: HistoryRow) -> tuple[float, int]:
    return (-row.started.timestamp(), -row.held.pk)


def _not_yet_charged(unopened: list[Slice], listed: set[int]) -> list[HistoryRow]:
    """Holdings begun but not yet seen by the meter (it opens them at its next tick): their cost so far,
    from their recorded moments at the rate the meter will freeze. One no price covers is not billed."""
    holdings = [held for held in unopened if held.pk not in listed]
    found = costs.running_costs(holdings)
    return [HistoryRow.of_holding(found[held.pk]) for held in holdings if held.pk in found]


def _days(usages: QuerySet[Usage], rows: list[HistoryRow]) -> list[tuple[Day, str]]:
    """What each day's usages cost, by the day they started: the bars of the history."""
    by_day: dict[date, Decimal] = defaultdict(Decimal)
    charged = (
        usages.annotate(day=TruncDate("started", tzinfo=UTC))
        .values("day")
        .annotate(amount=Sum(F("per_minute") * F("billed_minutes")))
        .order_by()
    )
    for found in charged:
        by_day[found["day"]] += money.exact(found["amount"])
    for row in rows:
        if not row.charged:
            by_day[row.started.astimezone(UTC).date()] += row.cost
    return [(Day(day, amount), money.shown(amount)) for day, amount in sorted(by_day.items())]


def _own_holding(user: User, slice_id: int) -> Slice:
    """A holding of the person's own; anyone else's answers exactly like one that does not exist."""
    found = access.slices_for(user, access.Action.COST).filter(pk=slice_id, held_from__isnull=False)
    held = found.select_related("gpu__host").first()
    if held is None:
        raise Http404("No such usage among yours.")
    return held


@login_required
@require_GET
def holding_cost(request: PortalRequest, slice_id: int) -> HttpResponse:
    """The cost so far of one holding: htmx fetches it again when its next minute starts."""
    held = _own_holding(_person(request), slice_id)
    return render(request, COST, cost_context(held, costs.running(held)))


def cost_context(held: Slice, found: costs.Running | None) -> dict[str, object]:
    """The card's cost of one holding, from its ``costs.Running`` (None: no price covers it)."""
    live = found is not None and held.held_until is None and held.released_at is None
    return {
        "held": held,
        "cost": money.shown(found.cost) if found else "—",
        "minutes": found.minutes if found else 0,
        "priced": found is not None,
        "live": live,
        "delay": round(found.next_minute_in, 1) if found and live else 0,
    }


@login_required
@require_GET
def notices(request: PortalRequest) -> HttpResponse:
    return render(request, NOTICES, notices_context(_person(request)))


def notices_context(user: User) -> dict[str, object]:
    stop = credit.open_stop(user)
    empty = stop is not None and ledger.balance(user) <= 0  # the balance is read only under a stop
    return {
        "zero_balance": credit.zero_balance_text(stop.stop_at) if stop and empty else "",
        "stopped": bool(stop and stop.stopped_at and empty),
        "alerts": list(budgets.alerts_for(user, budgets.month_of(timezone.now()))),
    }


@login_required
@require_POST
def budget(request: PortalRequest) -> HttpResponse:
    """A person sets or removes their own monthly budget."""
    user = _person(request)
    if request.POST.get("remove"):
        budgets.remove_budget(by=user, user=user)
        messages.info(request, "Your budget is removed.")
        return redirect("billing-account")
    form = BudgetForm(request.POST)
    if form.is_valid():
        try:
            set_to = budgets.set_budget(form.cleaned_data["monthly"], by=user, user=user)
        except ValidationError as error:
            form.add_error("monthly", error)
        else:
            messages.success(request, f"Your monthly budget is {money.shown(set_to.monthly)}.")
            return redirect("billing-account")
    context = {**_summary(user), **_history(user, HistoryFilter({})), "budget_form": form}
    return render(request, PAGE, context, status=400)
