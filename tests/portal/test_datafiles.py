"""Secrets made once in the data directory: private, and the same for processes that start together."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from portal.datafiles import secret_file
from portal.sso.keys import signing_key

ROOT = Path(__file__).resolve().parents[2]


def test_a_secret_is_made_once_and_readable_by_its_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "deeper" / "token"
    first = secret_file(path)
    assert len(first) > 40
    assert secret_file(path, lambda: "something else") == first
    assert path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["token"]


def test_processes_starting_together_agree_on_one_secret(tmp_path: Path) -> None:
    path = tmp_path / "token"
    # Each racer waits for the same moment, then reaches for a secret that takes a while to make
    # (as an RSA key does).
    code = (
        "import secrets, sys, time; from pathlib import Path; from portal.datafiles import secret_file\n"
        "while time.time() < float(sys.argv[2]): pass\n"
        "print(secret_file(Path(sys.argv[1]), lambda: time.sleep(0.3) or secrets.token_urlsafe(48)))"
    )
    start = str(time.time() + 1.5)
    racers = [
        subprocess.Popen([sys.executable, "-c", code, str(path), start], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        for _ in range(6)
    ]
    answers = {racer.communicate(timeout=30)[0].strip() for racer in racers}
    assert answers == {path.read_text().strip()}


def test_where_secrets_come_from_the_environment_none_is_made_and_the_missing_one_is_named(tmp_path: Path) -> None:
    # The containers share no data folder: a secret one program made would differ from another's.
    environ = {
        key: value for key, value in os.environ.items() if not key.startswith("PORTAL_") and key != "DATABASE_URL"
    }
    environ.update(PORTAL_DATA_DIR=str(tmp_path), PORTAL_SECRETS_FROM_ENVIRONMENT="true")
    check = lambda: subprocess.run(  # noqa: E731
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60
    )
    first = check()
    assert first.returncode != 0 and "PORTAL_SECRET_KEY is not set" in first.stderr
    assert "PORTAL_SECRETS_FROM_ENVIRONMENT=true" in first.stderr
    environ["PORTAL_SECRET_KEY"] = "k" * 50
    second = check()
    assert second.returncode != 0 and "PORTAL_SECRET_KEY" not in second.stderr
    assert " is not set: with PORTAL_SECRETS_FROM_ENVIRONMENT=true" in second.stderr  # the next one, by its name
    assert list(tmp_path.iterdir()) == [], "no secret was written"


def test_a_signing_key_given_on_one_line_is_read_with_its_line_breaks(tmp_path: Path) -> None:
    made = signing_key(tmp_path)
    assert signing_key(tmp_path / "unused", made.strip().replace("\n", "\\n")) == made.strip()
    assert not (tmp_path / "unused").exists()
