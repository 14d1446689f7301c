"""Issue a month's invoices by hand, the people's and then the billed groups': operators catching up after
beat was down on the 1st."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from billing import group_invoices, invoices


class Command(BaseCommand):
    help = "Issue the invoices of a calendar month (UTC) that has ended; ones already issued stay as they are."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--month", help="YYYY-MM; last month by default.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            month = datetime.strptime(options["month"], "%Y-%m").date() if options["month"] else invoices.last_month()
        except ValueError:
            raise CommandError("--month is YYYY-MM, e.g. 2026-11.") from None
        try:
            issued = invoices.issue_month(month)
            grouped = group_invoices.issue_month(month)
        except ValidationError as error:
            raise CommandError(" ".join(error.messages)) from None
        labels = ", ".join(invoice.label for invoice in issued) or "none"
        self.stdout.write(f"{month:%Y-%m}: {len(issued)} invoice(s): {labels}")
        labels = ", ".join(invoice.label for invoice in grouped) or "none"
        self.stdout.write(f"{month:%Y-%m}: {len(grouped)} group invoice(s): {labels}")
