"""Billing pages: a user's own money, and the finance view for billing staff."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required, permission_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


@login_required
def account(request: HttpRequest) -> HttpResponse:
    return render(request, "billing/account.html")


@permission_required("billing.view_finance", raise_exception=True)
def finance(request: HttpRequest) -> HttpResponse:
    return render(request, "billing/finance.html")
