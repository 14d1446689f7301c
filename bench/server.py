"""A throw-away portal for benchmarks: its own data directory and database, daphne on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from http.cookiejar import CookieJar
from pathlib import Path
from types import TracebackType
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# One per benchmark process: two benchmarks running at once (spawn and allocator, say) never drop each other's.
BENCH_DB = f"portal_bench_{os.getpid()}"
LOGS = ROOT / "artifacts" / "logs"


class BenchFailed(RuntimeError):
    """A step of a benchmark failed; the message says which and carries what it wrote to stderr."""


def run_checked(command: list[str], what: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run one step to its end and return its output; if it fails, raise with its stderr, never a bare status."""
    result = subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)
    if result.returncode != 0:
        said = (result.stderr.strip() or result.stdout.strip() or "(nothing on stderr or stdout)")[-4000:]
        raise BenchFailed(f"{what} exited with {result.returncode}:\n{said}")
    return result


def _postgres_url() -> str | None:
    given = os.environ.get("DATABASE_URL", "")
    return given if given.startswith(("postgres://", "postgresql://")) else None


def bench_database_url(data_dir: Path) -> str:
    """A separate PostgreSQL database next to DATABASE_URL's, or SQLite in data_dir (drop_bench_database)."""
    given = _postgres_url()
    if given is None:
        return f"sqlite:///{data_dir / 'bench.sqlite3'}"
    with psycopg.connect(given, autocommit=True) as connection:
        connection.execute(f"DROP DATABASE IF EXISTS {BENCH_DB}")
        connection.execute(f"CREATE DATABASE {BENCH_DB}")
    return urllib.parse.urlunsplit(urllib.parse.urlsplit(given)._replace(path=f"/{BENCH_DB}"))


def drop_bench_database() -> None:
    """Remove the database bench_database_url made (SQLite goes with the data directory), once the
    benchmark's processes are gone. Never raises: it runs on the way out of a run that may have failed."""
    given = _postgres_url()
    if given is None:
        return
    try:
        with psycopg.connect(given, autocommit=True) as connection:
            connection.execute(f"DROP DATABASE IF EXISTS {BENCH_DB}")
    except psycopg.Error as error:
        print(f"bench: could not drop the database {BENCH_DB}: {error}", file=sys.stderr)


def stop_process(process: subprocess.Popen[Any], group: bool = False, timeout: float = 15) -> None:
    """Terminate a child, then kill it if it will not go. ``group``: it was started with
    ``start_new_session``, and whatever it started (a proxy the hub launched, say) goes with it."""

    def send(signal_number: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(process.pid, signal_number)
            else:
                process.send_signal(signal_number)

    if process.poll() is None:
        send(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            send(signal.SIGKILL)
            process.wait(timeout=5)
    if group:
        send(signal.SIGKILL)  # members the leader left behind


class BenchPortal:
    """Used as a context manager: on the way out, daphne stops and the benchmark's database goes."""

    def __init__(self, data_dir: Path, port: int) -> None:
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self.env = dict(os.environ)
        self.env.update(
            PORTAL_DATA_DIR=str(data_dir),
            DATABASE_URL=bench_database_url(data_dir),
            PORTAL_CELERY_QUEUE="bench",
            PORTAL_CACHE_PREFIX="bench",
            PORTAL_CHANNEL_PREFIX="bench",
            PORTAL_LOG_LEVEL="WARNING",
            # Python's cookie jar keeps TLS-only cookies off plain HTTP, unlike a browser on 127.0.0.1.
            PORTAL_SECURE_COOKIES="false",
        )
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> BenchPortal:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
        drop_bench_database()

    def manage(self, *args: str) -> str:
        command = [str(BIN / "python"), "manage.py", *args]
        return run_checked(command, f"manage.py {args[0]}", cwd=ROOT, env=self.env).stdout

    def prepare(self, username: str, password: str) -> None:
        self.manage("migrate", "--no-input", "--verbosity", "0")
        self.manage("collectstatic", "--no-input", "--verbosity", "0")
        code = (
            "from django.contrib.auth.models import User; "
            f"User.objects.create_user({username!r}, password={password!r}, is_staff=True)"
        )
        self.manage("shell", "-c", code)

    def start(self, log_name: str = "bench-daphne") -> int:
        """Start daphne; its log goes to artifacts/logs/<log_name>.log, so failures can be looked into."""
        LOGS.mkdir(parents=True, exist_ok=True)
        log = (LOGS / f"{log_name}.log").open("wb")
        self.process = subprocess.Popen(
            [str(BIN / "daphne"), "--bind", "127.0.0.1", "--port", str(self.port), "portal.asgi:application"],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.base + "/healthz", timeout=1):
                    return self.process.pid
            except OSError:
                time.sleep(0.1)
        raise BenchFailed(f"daphne did not answer within 30 s (its log: {LOGS / log_name}.log)")

    def login_cookie(self, username: str, password: str) -> str:
        """Log in through the real form (CSRF and all) and return the Cookie header."""
        jar = CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        page = opener.open(self.base + "/accounts/login/").read().decode()
        match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert match, "no CSRF token on the login page"
        form = urllib.parse.urlencode({"username": username, "password": password, "csrfmiddlewaretoken": match[1]})
        request = urllib.request.Request(
            self.base + "/accounts/login/", data=form.encode(), headers={"Referer": self.base}
        )
        opener.open(request).read()
        cookies = {cookie.name: cookie.value for cookie in jar}
        assert "sessionid" in cookies, "login failed"
        return "; ".join(f"{name}={value}" for name, value in cookies.items())

    def cpu_seconds(self) -> float:
        assert self.process is not None
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)
