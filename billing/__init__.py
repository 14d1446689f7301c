"""Prices, the per-minute meter, the ledger, invoices and the finance views."""
