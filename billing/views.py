"""Billing pages: the staff's price table (a person's own money: billing/wallet.py; staff's credit and
budgets: billing/grants.py; the finance view: billing/finance.py)."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.http import HttpResponse
from django.shortcuts import redirect, render

from billing import prices
from billing.forms import PriceForm
from billing.models import Price
from portal.access import staff_required
from portal.clock import database_now
from portal.http import PortalRequest

PRICES = "billing/prices.html"


@staff_required
def price_list(request: PortalRequest) -> HttpResponse:
    """Staff: the prices in force, the latest changes, and a form that adds a price."""
    form = PriceForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        added = _add(request, form)
        if added is not None:
            messages.success(request, f"Added: {added}.")
            if not request.htmx:
                return redirect("billing-prices")
            form = PriceForm()
    status = 400 if form.errors and not request.htmx else 200  # htmx swaps only a 2xx answer
    context = {
        "form": form,
        "currency": settings.CURRENCY,
        "current": prices.current(),
        "history": Price.objects.select_related("created_by").order_by("-created_at", "-id")[:30],
    }
    target = "#price-area" if request.htmx else ""
    return render(request, PRICES + target, context, status=status)


def _add(request: PortalRequest, form: PriceForm) -> Price | None:
    data = form.cleaned_data
    key = prices.PriceKey(data["model_name"], data["kind"], data["profile"].strip(), data["market"])
    by = request.user
    assert isinstance(by, User)
    try:
        return prices.add_price(
            key, data["per_hour"], data["effective_from"] or database_now(), by=by, source=data["source"]
        )
    except ValidationError as error:
        field = "per_hour" if error.code in ("negative", "too_many_decimals", "not_a_number", "absurd") else None
        form.add_error(field, error)
        return None
