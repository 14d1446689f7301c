"""Staff's Credit page: grant or top up someone's credit with a reason, set monthly budgets of people and
groups, and read back every credit given (who gave it, when, why). The checks live in billing.ledger
and billing.credit; this module parses and renders.
"""

from __future__ import annotations

import secrets
from decimal import Decimal

from django import forms
from django.contrib import messages
from django.contrib.auth.models import Group, User
from django.core.exceptions import ValidationError
from django.http import HttpResponse
from django.shortcuts import redirect, render

from billing import budgets, ledger, money
from billing.models import Account, Budget, LedgerTransaction
from portal.access import staff_required
from portal.http import PortalRequest

PAGE = "billing/credit.html"


class CreditForm(forms.Form):
    username = forms.CharField(label="Person", max_length=150, help_text="Their user name.")
    amount = forms.CharField(max_length=20, help_text="More than zero, at most two decimals.")
    kind = forms.ChoiceField(
        choices=[
            (LedgerTransaction.Kind.TOP_UP, "Top-up (paid)"),
            (LedgerTransaction.Kind.GRANT, "Grant (promotional)"),
        ]
    )
    reason = forms.CharField(max_length=300, help_text="Why: an invoice number, a course, a refund.")
    # One key per form shown: a double click, a reload that posts again or a second tab sends the same one, and
    # the ledger posts it once.
    key = forms.CharField(max_length=64, widget=forms.HiddenInput, initial=lambda: secrets.token_urlsafe(24))

    def clean_username(self) -> User:
        user = User.objects.filter(username=self.cleaned_data["username"].strip()).first()
        if user is None:
            raise ValidationError("Nobody has that user name.")
        return user


class BudgetForm(forms.Form):
    group = forms.ModelChoiceField(queryset=Group.objects.order_by("name"), required=False, empty_label="(a person)")
    username = forms.CharField(label="or person", max_length=150, required=False)
    monthly = forms.CharField(label="Monthly budget", max_length=20, required=False, help_text="Empty: remove it.")

    def clean(self) -> dict[str, object]:
        data = super().clean() or {}
        name = str(data.get("username") or "").strip()
        if bool(data.get("group")) == bool(name):
            raise ValidationError("Pick a group or name a person (one of them).")
        if name:
            data["user"] = User.objects.filter(username=name).first()
            if data["user"] is None:
                self.add_error("username", "Nobody has that user name.")
        return data


def _staff(request: PortalRequest) -> User:
    assert isinstance(request.user, User)
    return request.user


@staff_required
def credit_page(request: PortalRequest) -> HttpResponse:
    form = CreditForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            ledger.grant_credit(
                data["username"], data["amount"], by=_staff(request), reason=data["reason"], kind=data["kind"],
                key=data["key"],
            )  # fmt: skip
        except ledger.AlreadyPosted:
            messages.info(request, f"That credit for {data['username']} was already added; it was not added again.")
            return redirect("billing-credit")
        except ValidationError as error:
            form.add_error("amount" if error.code in AMOUNT_CODES else None, error)
        else:
            messages.success(
                request, f"Added {money.shown(ledger.parse_credit(data['amount']))} to {data['username']}."
            )
            return redirect("billing-credit")
    return _render(request, credit_form=form, status=400 if form.errors else 200)


AMOUNT_CODES = ("not_a_number", "not_positive", "too_many_decimals", "absurd")


@staff_required
def budget_page(request: PortalRequest) -> HttpResponse:
    form = BudgetForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data, by = form.cleaned_data, _staff(request)
        whose = {"group": data["group"]} if data.get("group") else {"user": data["user"]}
        try:
            if not str(data.get("monthly") or "").strip():
                budgets.remove_budget(by=by, **whose)
                messages.info(request, "Budget removed.")
            else:
                set_to = budgets.set_budget(data["monthly"], by=by, **whose)
                messages.success(
                    request, f"Budget of {set_to.user or set_to.group}: {money.shown(set_to.monthly)} a month."
                )
        except ValidationError as error:
            form.add_error("monthly", error)
        else:
            return redirect("billing-credit")
    return _render(request, budget_form=form, status=400 if form.errors else 200)


def _render(request: PortalRequest, status: int = 200, **forms_: object) -> HttpResponse:
    given = LedgerTransaction.objects.filter(kind__in=list(ledger.CREDIT_SOURCES)).select_related("user", "created_by")
    context = {
        "credit_form": forms_.get("credit_form") or CreditForm(),
        "budget_form": forms_.get("budget_form") or BudgetForm(),
        "given": [(t, money.shown(_amount(t))) for t in given.prefetch_related("entries__account")[:50]],
        "budgets": [
            (b, money.shown(b.monthly))
            for b in Budget.objects.select_related("user", "group").order_by("group__name", "user__username")
        ],
    }
    return render(request, PAGE, context, status=status)


def _amount(given: LedgerTransaction) -> Decimal:
    return next((e.amount for e in given.entries.all() if e.account.kind == Account.Kind.WALLET), Decimal(0))
