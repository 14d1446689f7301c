"""The README documents every environment variable the portal, its commands and the hub's configuration read."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Every file that reads the environment: Django's settings (and each domain's, which they import), the first
# administrator, and what runs without Django (the hub's configuration, the proxy's launcher, the user network and
# body limits they share with the portal).
READERS = [
    "portal/settings.py",
    "portal/conf/base.py",
    "portal/conf/billing.py",
    "portal/conf/gpus.py",
    "portal/conf/notebooks.py",
    "portal/conf/render.py",
    "portal/management/commands/bootstrap_admin.py",
    "compose/hub/jupyterhub_config.py",
    "compose/hub/proxy.py",
    "sessions/runtime/network.py",
    "portal/entrylimits.py",
]
READ = re.compile(r'(?:\benv\.\w+\(|\benviron\.get\(|\benviron\[)\s*"([A-Z][A-Z0-9_]+)"')


def variables_read(path: str) -> set[str]:
    return set(READ.findall((ROOT / path).read_text()))


def documented() -> set[str]:
    table = (ROOT / "README.md").read_text()
    return set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)` \|", table, flags=re.MULTILINE))


def test_every_variable_read_anywhere_is_in_the_readme_table() -> None:
    missing = {path: sorted(variables_read(path) - documented()) for path in READERS}
    assert {path: names for path, names in missing.items() if names} == {}


def test_each_reader_is_seen_reading_something() -> None:
    """The pattern still matches how each file reads variables: a rewrite cannot silently hide them."""
    assert {path for path in READERS if not variables_read(path)} == set()
    assert {"PORTAL_ADMIN_PASSWORD", "PORTAL_HUB_STARTS_PROXY", "CONFIGPROXY_AUTH_TOKEN"} <= set().union(
        *(variables_read(path) for path in READERS)
    )
