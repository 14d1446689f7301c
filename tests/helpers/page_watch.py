"""What a page in Chromium did that it should not: a script error, a console error, a dialog, a CSP violation.

``PageWatch.on(page)`` starts listening before the first navigation. Playwright's
init script is injected by the browser itself, outside the page's
Content-Security-Policy, so it sees every violation the policy reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from playwright.sync_api import ConsoleMessage, Dialog, Page

# Each document starts with an empty list; read it before navigating away.
RECORD_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__cspViolations.push(
    `${event.effectiveDirective} blocked ${event.blockedURI || "inline"} at ${event.sourceFile}:${event.lineNumber}`
  );
});
"""


@dataclass
class PageWatch:
    page: Page
    console_errors: list[str] = field(default_factory=list)
    script_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    @classmethod
    def on(cls, page: Page) -> PageWatch:
        watch = cls(page)
        page.add_init_script(RECORD_VIOLATIONS)
        page.on("console", watch._console)
        page.on("pageerror", lambda error: watch.script_errors.append(str(error)))
        page.on("dialog", watch._dialog)
        return watch

    def _console(self, message: ConsoleMessage) -> None:
        # Chromium fails what is in flight when an address on the machine changes (ERR_NETWORK_CHANGED): the
        # tests beside this one add and remove Docker networks, Swarms and namespaces all along. It says
        # nothing of the page; any other failed load still counts.
        if message.type == "error" and "net::ERR_NETWORK_CHANGED" not in message.text:
            self.console_errors.append(f"{message.text} ({message.location.get('url', '')})")

    def _dialog(self, dialog: Dialog) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def violations(self) -> list[str]:
        """The current document's Content-Security-Policy violations."""
        return list(self.page.evaluate("window.__cspViolations || []"))

    def pwned(self) -> bool:
        """Whether any injected markup ran: the test payloads set window.__pwned."""
        return bool(self.page.evaluate("window.__pwned !== undefined"))

    def trouble(self) -> dict[str, list[str]]:
        """Everything that went wrong on this page so far; empty lists when nothing did."""
        return {
            "csp violations": self.violations(),
            "console errors": self.console_errors,
            "script errors": self.script_errors,
            "dialogs": self.dialogs,
        }

    def assert_clean(self, what: str) -> None:
        trouble = {kind: items for kind, items in self.trouble().items() if items}
        assert not trouble, f"{what}: {trouble}"
