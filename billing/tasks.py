"""Celery tasks of billing: thin, id-taking, idempotent; each calls the meter.

``charge_accrued`` runs from beat every minute (portal/celery.py); the end of every holding
(``sessions.gpus.holdings.end``) enqueues ``charge_holding`` by its name once a holding has ended, so its last,
partial minute is charged at once rather than at the next tick. ``check_credit`` runs from beat too:
budget alerts and the zero-balance warning and stop.
"""

from __future__ import annotations

from celery import shared_task

from billing import budgets, costs, credit, group_invoices, invoices, meter, rollup
from sessions.gpus.holdings import CHARGE_HOLDING


def _summary(outcome: meter.Outcome) -> dict[str, object]:
    return {
        "skipped": outcome.skipped,
        "usages_opened": outcome.usages_opened,
        "minutes": outcome.minutes,
        "transactions": outcome.transactions,
        "amount": str(outcome.amount),
    }


@shared_task
def charge_accrued() -> dict[str, object]:
    """Every minute: charge each minute that has become due; a second run meanwhile returns at once."""
    outcome = meter.tick()
    if outcome.minutes:
        costs.announce_charges()
    return _summary(outcome)


@shared_task(name=CHARGE_HOLDING)
def charge_holding(slice_id: int) -> dict[str, object]:
    """A holding ended: charge it to its end."""
    return _summary(meter.charge_holding(slice_id))


@shared_task
def check_credit() -> dict[str, int]:
    """Every 30 s: warn at a zero balance, stop sessions after the grace period, send budget alerts once."""
    counts = credit.check_balances()
    counts["budget_alerts"] = budgets.check_budgets()
    return counts


@shared_task
def fold_minutes() -> dict[str, object]:
    """Hourly: the minute rows of usages that ended long enough ago become one row per day."""
    folded = rollup.roll_up()
    return {"usages": folded.usages, "minutes": folded.minutes, "days": folded.days, "amount": str(folded.amount)}


@shared_task
def issue_invoices() -> dict[str, object]:
    """On the 1st (UTC): last month's invoices, after the meter has charged every minute of it that is due
    (waiting for a tick in progress, never skipping it); a rerun finds them issued and changes nothing."""
    meter.charge_all()
    month = invoices.last_month()
    issued = invoices.issue_month(month)
    return {"month": f"{month:%Y-%m}", "invoices": [invoice.number for invoice in issued]}


@shared_task
def issue_group_invoices() -> dict[str, object]:
    """On the 1st (UTC), after ``issue_invoices``: last month's invoice of each billed group (issuing any
    member's own invoice still missing); a rerun finds them issued and changes nothing."""
    meter.charge_all()
    month = invoices.last_month()
    issued = group_invoices.issue_month(month)
    return {"month": f"{month:%Y-%m}", "group_invoices": [invoice.number for invoice in issued]}
