"""The hub's configuration file reads its variables as the portal's settings do: a bad value is named."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

ROOT = Path(__file__).resolve().parents[2]
VARIABLES = (
    "PORTAL_HUB_DATA_DIR",
    "PORTAL_PUBLIC_URL",
    "PORTAL_INTERNAL_URL",
    "PORTAL_PROXY_API_PORT",
    "PORTAL_HUB_SERVICE_TOKEN",
    "PORTAL_HUB_STARTS_PROXY",
    "CONFIGPROXY_AUTH_TOKEN",
    "PORTAL_ANONYMOUS_MAX_BODY_BYTES",
    "PORTAL_MAX_BODY_BYTES",
    "PORTAL_RENDER_UPLOAD_PART_BYTES",
    "PORTAL_JUPYTER_MAX_BODY_BYTES",
    "PORTAL_PROXY_BODIES_AT_ONCE",
)


def load(monkeypatch: pytest.MonkeyPatch, data: Path, **env: str) -> Config:
    """The file as JupyterHub loads it (``-f``), with only these variables set besides the data directory."""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PORTAL_DATA_DIR", str(data))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    (data / "hub_service_token").write_text("service-token\n")
    (data / "hub_oauth_secret").write_text("oauth-secret\n")
    return PyFileConfigLoader("jupyterhub_config.py", path=str(ROOT / "compose/hub")).load_config()


def test_the_hub_config_takes_its_addresses_and_secrets_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = load(
        monkeypatch,
        tmp_path,
        PORTAL_PUBLIC_URL="http://127.0.0.1:9000/",
        PORTAL_PROXY_API_PORT="9001",
        PORTAL_HUB_STARTS_PROXY="no",
        CONFIGPROXY_AUTH_TOKEN="proxy-token",
    )
    assert config.JupyterHub.bind_url == "http://127.0.0.1:9000/jupyter/"
    assert config.ConfigurableHTTPProxy.api_url == "http://127.0.0.1:9001"
    assert config.ConfigurableHTTPProxy.should_start is False
    assert config.ConfigurableHTTPProxy.auth_token == "proxy-token"
    assert config.PortalSpawner.portal_token == "service-token"
    assert config.JupyterHub.db_url == f"sqlite:///{tmp_path / 'hub' / 'jupyterhub.sqlite'}"


def test_the_hub_starts_its_proxy_unless_told_not_to(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = load(monkeypatch, tmp_path, PORTAL_HUB_SERVICE_TOKEN="given-token")
    assert config.ConfigurableHTTPProxy.should_start is True
    assert config.ConfigurableHTTPProxy.api_url == "http://127.0.0.1:8001"
    assert config.PortalSpawner.portal_token == "given-token"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("PORTAL_PROXY_API_PORT", "eighty", "PORTAL_PROXY_API_PORT must be a whole number (got 'eighty')."),
        ("PORTAL_PROXY_API_PORT", "0", "PORTAL_PROXY_API_PORT must be at least 1 (got 0)."),
        ("PORTAL_HUB_STARTS_PROXY", "maybe", "PORTAL_HUB_STARTS_PROXY must be true or false (got 'maybe')."),
    ],
)
def test_a_bad_value_stops_the_hub_with_the_variables_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, value: str, message: str
) -> None:
    with pytest.raises(ImproperlyConfigured) as refused:
        load(monkeypatch, tmp_path, **{name: value})
    assert str(refused.value) == message


def test_the_hub_and_make_run_start_the_same_gate_with_the_same_body_limits(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import os
    import sys

    sys.path.insert(0, str(ROOT / "compose/hub"))
    import proxy  # type: ignore[import-not-found]  # a program of its own, not a package module

    limits = {"PORTAL_ANONYMOUS_MAX_BODY_BYTES": "4096", "PORTAL_JUPYTER_MAX_BODY_BYTES": str(64 << 20)}
    hub_started = load(monkeypatch, tmp_path, **limits).ConfigurableHTTPProxy.command
    run_started = proxy.command(dict(os.environ))
    assert hub_started[0] == run_started[0] == str(ROOT / "compose/hub/gate.mjs")
    passed = [argument for argument in run_started if argument.startswith("--") and "=" in argument]
    assert "--anonymous-body-bytes=4096" in passed and f"--jupyter-body-bytes={64 << 20}" in passed
    assert passed == [argument for argument in hub_started if argument.startswith("--") and "=" in argument]


def test_a_bad_body_limit_stops_the_hub_with_the_variables_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(ImproperlyConfigured) as refused:
        load(monkeypatch, tmp_path, PORTAL_JUPYTER_MAX_BODY_BYTES="lots")
    assert str(refused.value) == "PORTAL_JUPYTER_MAX_BODY_BYTES must be a whole number (got 'lots')."
