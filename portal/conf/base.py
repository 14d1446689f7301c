"""What every settings module shares: the one environment reader (portal/env.py) and the project's folders."""

from __future__ import annotations

from pathlib import Path

from portal.env import Env

env = Env()
BASE_DIR = Path(__file__).resolve().parents[2]
DATA_DIR = env.path("PORTAL_DATA_DIR", BASE_DIR / "var")
