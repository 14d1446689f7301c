"""The Content-Security-Policy header, and the sources that must stay within it.

The browser tests (tests/e2e/test_csp_e2e.py) walk every page under the policy;
these pin the policy itself and catch, without a browser, a template or script
that would need it loosened: an inline script or style, an event-handler
attribute, markup built from strings.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client

ROOT = Path(__file__).resolve().parents[2]
OUR_SCRIPTS = sorted((ROOT / "static" / "js").glob("*.js"))
# The project's templates and each sessions/ app's own (sessions/<app>/templates/).
OUR_TEMPLATES = sorted([*(ROOT / "templates").rglob("*.html"), *(ROOT / "sessions").glob("*/templates/**/*.html")])


def directives(header: str) -> dict[str, list[str]]:
    parts = (part.split() for part in header.split(";") if part.strip())
    return {name: values for name, *values in parts}


@pytest.mark.django_db
def test_pages_carry_a_policy_that_forbids_inline_script_and_foreign_sources(alice: User) -> None:
    client = Client()
    login = client.get("/accounts/login/")
    client.force_login(alice)
    dashboard = client.get("/")
    for response in (login, dashboard):
        policy = directives(response["Content-Security-Policy"])
        assert policy["default-src"] == ["'self'"]
        assert policy["script-src"] == ["'self'"]
        assert policy["style-src"] == ["'self'"]
        assert policy["connect-src"] == ["'self'"]  # websockets: same origin, which 'self' covers
        assert policy["object-src"] == ["'none'"]
        assert policy["base-uri"] == ["'self'"]
        assert policy["frame-ancestors"] == ["'none'"]
        assert not any(value.startswith("'unsafe-") for values in policy.values() for value in values)


@pytest.mark.django_db
def test_htmx_is_told_not_to_eval_run_scripts_or_inject_styles(alice: User) -> None:
    client = Client()
    client.force_login(alice)
    page = client.get("/").content.decode()
    meta = re.search(r"<meta name=\"htmx-config\" content='([^']*)'>", page)
    assert meta is not None
    assert json.loads(meta.group(1)) == {"includeIndicatorStyles": False, "allowEval": False, "allowScriptTags": False}
    assert page.index('name="htmx-config"') < page.index("htmx-2.min")  # read when htmx loads


@pytest.mark.parametrize("path", OUR_TEMPLATES, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_template_has_inline_script_style_or_event_handlers(path: Path) -> None:
    text = path.read_text()
    assert not re.search(r"\sstyle\s*=", text), "a style attribute: use a class"
    assert not re.search(r"<style", text), "a <style> element: put it in static/css"
    assert not re.search(r"\son[a-z]+\s*=", text), "an event-handler attribute: bind it in static/js"
    for tag in re.findall(r"<script\b[^>]*>", text):
        assert "src=" in tag, f"an inline script: {tag}"
    assert "javascript:" not in text


@pytest.mark.parametrize("path", OUR_SCRIPTS, ids=lambda path: path.name)
def test_no_script_of_ours_builds_markup_from_strings(path: Path) -> None:
    text = path.read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in text, f"{path.name} uses {sink}: build nodes with textContent / createElement"
