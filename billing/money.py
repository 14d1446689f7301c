"""Money: Decimal amounts, the one rounding rule, and how an amount is shown.

The rule, written here and nowhere else: a price is an hourly rate with at most
four decimals; what one started minute costs is that rate divided by 60 (and
by N for one of N time-sliced shares of a GPU) and rounded once, half up, to
six decimals (``per_minute``). Every charge is a whole number of such minutes,
so every amount in the ledger is exact at six decimals and sums never round
again. Pages show amounts rounded half up to
two decimals in the currency of PORTAL_CURRENCY.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from django.conf import settings
from django.core.exceptions import ValidationError

RATE_PLACES = 4  # an hourly price: at most this many decimals
AMOUNT_PLACES = 6  # a per-minute amount, and so every ledger amount
SHOWN_PLACES = 2
MINUTES_PER_HOUR = 60
AMOUNT_QUANTUM = Decimal(1).scaleb(-AMOUNT_PLACES)
SHOWN_QUANTUM = Decimal(1).scaleb(-SHOWN_PLACES)


def per_minute(per_hour: Decimal, shares: int = 1) -> Decimal:
    """What one started minute costs at an hourly rate (of one of ``shares`` shares): the rounding rule.

    One division, one rounding; the meter's SQL says the same (``ROUND(per_hour / (60 * shares), 6)``).
    """
    return (per_hour / (MINUTES_PER_HOUR * shares)).quantize(AMOUNT_QUANTUM, rounding=ROUND_HALF_UP)


def exact(amount: Decimal | float | None) -> Decimal:
    """A sum of ledger amounts as a database gave it, exact again at six decimals. Every amount is a whole number
    of millionths, so their sum is too; but SQLite adds decimals as binary floats (fifteen significant digits:
    -0.97537 came back as -0.975369999999999) and PostgreSQL's sum of products carries more places. Rounding to
    millionths gives the exact sum back. None (a sum of nothing) is zero."""
    if amount is None:
        return Decimal(0)
    return Decimal(amount).quantize(AMOUNT_QUANTUM, rounding=ROUND_HALF_UP)


def decimals(amount: Decimal) -> int:
    """How many decimals an amount is written with (``8.50`` has two, ``8.5`` one)."""
    exponent = amount.as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


def shown(amount: Decimal) -> str:
    """An amount as people read it: ``8.50 CNY``."""
    return f"{amount.quantize(SHOWN_QUANTUM, rounding=ROUND_HALF_UP):,} {settings.CURRENCY}"


def parse_amount(value: object, *, what: str, example: str, not_positive: str, most: Decimal, per: str) -> Decimal:
    """An amount someone typed (credit, a budget): a number above zero, at most two decimals, not absurd.

    ``what`` names it in the errors ("A budget"), ``example`` shows one, ``per`` says what ``most`` is per.
    """
    try:
        amount = value if isinstance(value, Decimal) else Decimal(str(value).strip())
    except InvalidOperation:
        raise ValidationError(f"{what} is a number, e.g. {example}.", code="not_a_number") from None
    if not amount.is_finite():
        raise ValidationError(f"{what} is a number, e.g. {example}.", code="not_a_number")
    if amount <= 0:
        raise ValidationError(not_positive, code="not_positive")
    if decimals(amount) > SHOWN_PLACES:
        raise ValidationError(f"{what} has at most {SHOWN_PLACES} decimals.", code="too_many_decimals")
    if amount > most:
        raise ValidationError(f"More than {most:,} {per}: check the figure.", code="absurd")
    return amount
