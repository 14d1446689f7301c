"""Billing's settings: the currency, when minute rows are folded into days, the credit a launch needs and the grace
at a zero balance, and the notice a spot session gets before its slice is reclaimed. portal/settings.py imports
them."""

from __future__ import annotations

import re

from django.core.exceptions import ImproperlyConfigured

from portal.conf.base import env

# Billing: an ended usage's minute rows are folded into one row per day this many days after its end.
BILLING_MINUTE_DAYS = env.integer("PORTAL_BILLING_MINUTE_DAYS", 3, minimum=1)

# Billing: the currency prices and the ledger are in (an ISO 4217 code; amounts show with two decimals).
CURRENCY = env.text("PORTAL_CURRENCY", "CNY").upper()
if not re.fullmatch(r"[A-Z]{3}", CURRENCY):
    raise ImproperlyConfigured(f"PORTAL_CURRENCY must be a three-letter currency code such as CNY (got {CURRENCY!r}).")
# A launch is refused unless the balance covers this many minutes of it and of what already runs (0: never
# refused for credit); at a zero balance people are warned and their sessions stop this many minutes later.
BILLING_MIN_MINUTES = env.integer("PORTAL_BILLING_MIN_MINUTES", 10, minimum=0)
BILLING_GRACE_MINUTES = env.integer("PORTAL_BILLING_GRACE_MINUTES", 5, minimum=0)

# Spot: how long a spot session's owner is told before its slice is reclaimed for an on-demand launch
# (a cloud's spot interruption notice; AWS gives two minutes).
SPOT_GRACE_SECONDS = env.integer("PORTAL_SPOT_GRACE_SECONDS", 120, minimum=0)
