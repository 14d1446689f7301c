"""Group invoices' pages: one group invoice (print-ready HTML, like a person's invoice), its CSV, and staff's
Billed groups page, where they mark a group as billed, say whom its invoices go to, or stop billing it.
The rules live in billing/group_invoices.py; this module parses and renders.
"""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import Group, User
from django.core.exceptions import ValidationError
from django.db.models import Count
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from billing import group_invoices, money
from billing.models import BilledGroup, BilledGroupChange, GroupInvoice
from portal.access import staff_required
from portal.http import PortalRequest
from portal.roles import is_operator

PAGE = "billing/group_invoice.html"
GROUPS = "billing/billed_groups.html"
LIST = "billing/group_invoice_list.html"
TOTALS = ("total", "credit_applied", "balance_due")
CHANGES_LISTED = 50


class BilledGroupForm(forms.Form):
    group = forms.ModelChoiceField(queryset=Group.objects.order_by("name"))
    billing_name = forms.CharField(
        label="Billed to", max_length=200, help_text="Whom its invoices are addressed to, e.g. a department."
    )
    billing_email = forms.EmailField(label="Billing e-mail", required=False)


@login_required
@require_GET
def group_invoice_page(request: PortalRequest, number: int) -> HttpResponse:
    found = group_invoices.group_invoice_for(request.user, number)
    context = {
        "invoice": found,
        "members": group_invoices.members_of(found),
        "shown": {field: money.shown(getattr(found, field)) for field in TOTALS},
        "is_staff": is_operator(request.user),
    }
    return render(request, PAGE, context)


@login_required
@require_GET
def group_invoice_csv(request: PortalRequest, number: int) -> HttpResponse:
    found = group_invoices.group_invoice_for(request.user, number)
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{found.label}-{found.month:%Y-%m}.csv"'
    group_invoices.write_csv(found, response)
    return response


def list_context(user: User) -> dict[str, object]:
    """A person's billing page: the invoices of their billed groups, if they may see them."""
    found = group_invoices.of_my_groups(user)
    return {"group_invoices": [(invoice, money.shown(invoice.total)) for invoice in found]}


@staff_required
def billed_groups(request: PortalRequest) -> HttpResponse:
    """Staff: which groups are billed and to whom, a form that bills one, who changed which and why, and the
    latest group invoices."""
    form = BilledGroupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data, by = form.cleaned_data, request.user
        assert isinstance(by, User)
        try:
            billed = group_invoices.mark(data["group"], data["billing_name"], data["billing_email"], by=by)
        except ValidationError as error:
            form.add_error("billing_name", error)
        else:
            messages.success(request, f"Group {billed.group.name} is billed to {billed.billing_name}.")
            return redirect("billing-groups")
    return _render(request, form, status=400 if form.errors else 200)


def _render(request: PortalRequest, form: BilledGroupForm, status: int, stop_error: str = "") -> HttpResponse:
    context = {
        "form": form,
        "billed": BilledGroup.objects.select_related("group", "marked_by").annotate(members=Count("group__user")),
        "changes": BilledGroupChange.objects.select_related("group", "by")[:CHANGES_LISTED],
        "stop_error": stop_error,
        "issued": [
            (invoice, money.shown(invoice.total))
            for invoice in GroupInvoice.objects.select_related("group").order_by("-month", "-number")[:50]
        ],
    }
    return render(request, GROUPS, context, status=status)


@staff_required
@require_POST
def unbill_group(request: PortalRequest, group_id: int) -> HttpResponse:
    """Staff stop billing a group, with a reason; without one the page says so and nothing changes."""
    group = get_object_or_404(Group, pk=group_id)
    assert isinstance(request.user, User)
    try:
        group_invoices.unmark(group, by=request.user, reason=request.POST.get("reason", ""))
    except ValidationError as error:
        return _render(request, BilledGroupForm(), status=400, stop_error=f"{group.name}: {' '.join(error.messages)}")
    messages.info(request, f"Group {group.name} is no longer billed; the invoices it was issued stay.")
    return redirect("billing-groups")
