"""Billing records: prices, usages and their charged minutes, and the double-entry ledger.

A usage is one holding of a slice (``Slice.held_from`` to ``Slice.held_until``)
with the rate frozen from the price in force when it began; each of its started
minutes is one ``ChargedMinute`` row, unique per (usage, minute), written in the
same database transaction as the ledger entries that charge it. Ledger rows are
append-only: a correction is a reversing transaction (PostgreSQL refuses an
update, a delete and an unbalanced transaction: migration 0003).
"""

from billing.models.base import AppendOnly, FinanceAccess, Market
from billing.models.credit import Budget, BudgetAlert, CreditStop
from billing.models.invoices import (
    BilledGroup,
    BilledGroupChange,
    CreditNote,
    GroupInvoice,
    GroupInvoiceMember,
    Invoice,
    InvoiceLine,
    Issued,
)
from billing.models.ledger import Account, ChargedMinute, Entry, LedgerTransaction, UsageDay
from billing.models.prices import BilledTotal, Price, Usage

__all__ = [
    "Account",
    "AppendOnly",
    "BilledGroup",
    "BilledGroupChange",
    "BilledTotal",
    "Budget",
    "BudgetAlert",
    "ChargedMinute",
    "CreditNote",
    "CreditStop",
    "Entry",
    "FinanceAccess",
    "GroupInvoice",
    "GroupInvoiceMember",
    "Invoice",
    "InvoiceLine",
    "Issued",
    "LedgerTransaction",
    "Market",
    "Price",
    "Usage",
    "UsageDay",
]
