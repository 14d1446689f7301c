"""A person's invoices on their billing page (billing/invoices.py issues them)."""

from __future__ import annotations

from typing import Any

from django import template
from django.contrib.auth.models import User

from billing import invoices

register = template.Library()


@register.inclusion_tag(invoices.LIST)
def invoice_list(user: User) -> dict[str, Any]:
    return invoices.list_context(user)
