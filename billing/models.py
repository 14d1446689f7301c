"""Billing models. Prices, meter and ledger arrive with the billing issue."""

from django.db import models


class FinanceAccess(models.Model):
    """Carries the permission that opens the finance views; it has no table."""

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [("view_finance", "Can see revenue, usage and every account's money")]

    def __str__(self) -> str:
        return "finance access"
