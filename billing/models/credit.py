"""Budgets, their alerts, and the stops at zero credit."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import models
from django.db.models import Q
from django.utils import timezone

from billing import money


class Budget(models.Model):
    """A monthly spending figure for one person or one group: alerts at 50, 80 and 100 % of it (no stop)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True, related_name="budget"
    )
    group = models.OneToOneField(Group, on_delete=models.CASCADE, null=True, blank=True, related_name="budget")
    monthly = models.DecimalField(max_digits=14, decimal_places=money.SHOWN_PLACES, help_text="Per calendar month.")
    set_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, related_name="+")
    set_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(user__isnull=False, group__isnull=True) | Q(user__isnull=True, group__isnull=False),
                name="budget_of_a_person_or_a_group",
            ),
            models.CheckConstraint(condition=Q(monthly__gt=0), name="budget_positive"),
        ]

    def __str__(self) -> str:
        return f"budget of {self.user or self.group}: {self.monthly} a month"


class BudgetAlert(models.Model):
    """A threshold of a budget crossed in a month: one row, so the alert is shown and pushed exactly once;
    its mail is marked sent only once the mail server has taken it, and given up (recorded, for staff to
    see) after a week of failures."""

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="alerts")
    month = models.DateField(help_text="The first day of the (UTC) month.")
    threshold = models.PositiveSmallIntegerField(help_text="Percent: 50, 80 or 100.")
    spent = models.DecimalField(max_digits=18, decimal_places=money.AMOUNT_PLACES)
    sent_at = models.DateTimeField(default=timezone.now, help_text="When it was recorded, shown and pushed.")
    mail_due = models.BooleanField(
        default=False, db_default=False, help_text="Its mail is still to go out: a failed send is tried again."
    )
    mailed_at = models.DateTimeField(null=True, blank=True, help_text="When the mail server took its mail.")
    mail_error = models.CharField(max_length=300, blank=True, help_text="Why its mail's last send failed.")
    mail_given_up_at = models.DateTimeField(
        null=True, blank=True, help_text="When its mail, failing for a week, was given up: it never went out."
    )

    class Meta:
        ordering = ["-sent_at", "-threshold"]
        constraints = [
            models.UniqueConstraint(fields=["budget", "month", "threshold"], name="budget_alert_once"),
        ]

    def __str__(self) -> str:
        return f"{self.threshold} % of {self.budget} in {self.month:%Y-%m}"


class CreditStop(models.Model):
    """A person's balance reached zero while they held slices: warned at ``warned_at``, their sessions
    stopped after the grace period (``stopped_at``), or credit came back first (``cleared_at``)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="credit_stops")
    warned_at = models.DateTimeField(default=timezone.now)
    stop_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)
    cleared_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-warned_at"]
        constraints = [
            models.UniqueConstraint(fields=["user"], condition=Q(cleared_at__isnull=True), name="credit_stop_one_open"),
        ]

    def __str__(self) -> str:
        return f"zero balance of user {self.user_id} from {self.warned_at}"
