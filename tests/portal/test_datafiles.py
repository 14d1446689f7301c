"""Secrets made once in the data directory: private, and the same for processes that start together."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from portal.datafiles import secret_file

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
