"""Settings come from the environment; bad values stop start-up naming the variable."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from portal.env import Env

ROOT = Path(__file__).resolve().parents[2]


def run_check(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PORTAL_") and k != "DATABASE_URL"}
    clean.update(PORTAL_DATA_DIR=str(tmp_path), **env)
    return subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=clean, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PORTAL_DEBUG", "maybe"),
        ("DATABASE_URL", "mysql://root@127.0.0.1/portal"),
        ("DATABASE_URL", "not a url"),
        ("REDIS_URL", "http://127.0.0.1:6379"),
        ("PORTAL_TIME_ZONE", "Mars/Olympus_Mons"),
        ("PORTAL_SECRET_KEY", "too-short"),
        ("PORTAL_EMAIL_BACKEND", "pigeon"),
        ("PORTAL_LOGIN_FAILURE_LIMIT", "0"),
        ("PORTAL_EMAIL_PORT", "twenty-five"),
        ("PORTAL_CURRENCY", "yuan"),
        ("PORTAL_BILLING_MIN_MINUTES", "ten"),
        ("PORTAL_BILLING_GRACE_MINUTES", "-1"),
        ("PORTAL_DOCKER_ENGINES", "gpu-2=tcp://127.0.0.1:2376"),  # TCP without TLS: root on the host for anyone
        ("PORTAL_DOCKER_TLS_DIR", "/nonexistent"),
        ("PORTAL_DOCKER_ENGINES", "gpu-2=kube://Not_A_Namespace"),
    ],
)
def test_a_bad_value_stops_start_up_with_the_variables_name(tmp_path: Path, name: str, value: str) -> None:
    result = run_check(tmp_path, **{name: value})
    assert result.returncode != 0
    assert name in result.stderr
    assert "ImproperlyConfigured" in result.stderr


def test_simulated_hosts_the_fleet_lacks_stop_it_naming_them(tmp_path: Path) -> None:
    fleet = {"PORTAL_SIMULATED_FLEET": "n1: 1xL4:whole", "PORTAL_SIMULATED_HOSTS": "n1,n9"}
    result = run_check(tmp_path, PORTAL_GPU_BACKEND="simulated", **fleet)
    assert result.returncode != 0
    assert "PORTAL_SIMULATED_HOSTS names n9, which PORTAL_SIMULATED_FLEET does not have" in result.stderr


def test_a_tcp_engine_is_taken_with_a_folder_of_certificates(tmp_path: Path) -> None:
    tls = tmp_path / "tls"
    tls.mkdir()
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tls / name).write_text("-----BEGIN CERTIFICATE-----\n")
    result = run_check(tmp_path, PORTAL_DOCKER_ENGINES="gpu-2=tcp://127.0.0.1:2376", PORTAL_DOCKER_TLS_DIR=str(tls))
    assert result.returncode == 0, result.stderr


def test_defaults_start_without_any_variable(tmp_path: Path) -> None:
    result = run_check(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


def test_the_secret_key_is_generated_once_into_the_data_directory(tmp_path: Path) -> None:
    assert run_check(tmp_path).returncode == 0
    key_file = tmp_path / "secret_key"
    first = key_file.read_text()
    assert len(first) >= 50
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert run_check(tmp_path).returncode == 0
    assert key_file.read_text() == first


def test_the_default_database_is_a_sqlite_file_in_the_data_directory(tmp_path: Path) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PORTAL_") and k != "DATABASE_URL"}
    clean["PORTAL_DATA_DIR"] = str(tmp_path)
    code = "from django.conf import settings; print(settings.DATABASES['default']['NAME'])"
    result = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": "portal.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.strip() == str(tmp_path / "portal.sqlite3")


def test_flags_accept_the_usual_words() -> None:
    env = Env({"A": "yes", "B": "off", "C": " TRUE "})
    assert env.flag("A", False) is True
    assert env.flag("B", True) is False
    assert env.flag("C", False) is True
    assert env.flag("MISSING", True) is True


def test_lists_are_comma_separated_and_trimmed() -> None:
    assert Env({"HOSTS": "a.example, b.example,,"}).items("HOSTS", []) == ["a.example", "b.example"]


def test_a_number_below_its_minimum_is_refused() -> None:
    with pytest.raises(ImproperlyConfigured, match="LIMIT must be at least 1"):
        Env({"LIMIT": "0"}).integer("LIMIT", 5, minimum=1)
