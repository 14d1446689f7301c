"""Billing's pieces on other apps' pages: a holding's live cost on a session card, the dashboard's credit
card and its notices (zero balance, budget alerts). Templates load them; sessions' Python never imports
billing."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from django import template
from django.contrib.auth.models import User

from billing import money, wallet
from billing.costs import Running, running, running_costs
from billing.costs import wallet as wallet_of
from billing.launch import duration
from sessions.gpus.models import Slice

register = template.Library()


@register.inclusion_tag(wallet.COST)
def holding_cost(held: Slice | None, costs: Mapping[int, Running] | None = None) -> dict[str, Any]:
    """A holding's cost so far; a page that shows many passes ``costs`` (``session_costs``), read in a fixed
    number of queries for all of them, rather than having each card ask again."""
    if held is None or held.held_from is None:
        return {"held": None}
    found = costs.get(held.pk) if costs is not None else running(held)
    return wallet.cost_context(held, found)


class Holding(Protocol):
    """A workload of any kind with its one slice (a notebook session)."""

    slice: Slice | None


@register.simple_tag
def session_costs(sessions: Iterable[Holding]) -> dict[int, Running]:
    """The costs so far of the slices these workloads hold (their slices and GPUs loaded), for ``holding_cost``."""
    return running_costs([session.slice for session in sessions if session.slice is not None])


@register.inclusion_tag(wallet.NOTICES)
def billing_notices(user: User) -> dict[str, Any]:
    return wallet.notices_context(user)


@register.inclusion_tag("billing/partials/credit_card.html")
def credit_card(user: User) -> dict[str, Any]:
    found = wallet_of(user)
    left = found.time_left
    return {
        "balance": money.shown(found.balance),
        "burn": money.shown(found.burn_per_hour),
        "time_left": duration(left) if left is not None else None,
        "empty": found.balance <= 0,
    }
