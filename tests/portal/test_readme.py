"""The README documents every environment variable the settings read."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_setting_variable_is_in_the_readme_table() -> None:
    settings_source = (ROOT / "portal/settings.py").read_text()
    read = set(re.findall(r'env\.\w+\(\s*"([A-Z_]+)"', settings_source))
    table = (ROOT / "README.md").read_text()
    documented = set(re.findall(r"^\| `([A-Z_]+)` \|", table, flags=re.MULTILINE))
    assert read, "no variables found in settings"
    assert read - documented == set()
