"""A person's invoices on their billing page (billing/invoices.py issues them), and their billed groups'
(billing/group_invoices.py), where they may see them."""

from __future__ import annotations

from typing import Any

from django import template
from django.contrib.auth.models import User

from billing import group_pages, invoices

register = template.Library()


@register.inclusion_tag(invoices.LIST)
def invoice_list(user: User) -> dict[str, Any]:
    return invoices.list_context(user)


@register.inclusion_tag(group_pages.LIST)
def group_invoice_list(user: User) -> dict[str, Any]:
    return group_pages.list_context(user)
