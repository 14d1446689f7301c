"""The containers' one-shot set-up (manage.py setup_once): migrations, the first administrator and the hub's
OAuth client under one database lock, so set-ups started together (web replicas, a set-up service started
again) run one after another and the later ones find nothing to do."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from django.contrib.auth.models import User
from django.db import connection
from oauth2_provider.models import get_application_model

from portal.management.commands.setup_once import LOCK_KEY
from portal.sso.clients import HUB_CLIENT_ID
from tests.conftest import ROOT
from tests.helpers import processes

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(processes.test_database_url().startswith("sqlite"), reason="PostgreSQL's advisory lock"),
]


def test_set_ups_started_together_wait_for_the_lock_and_make_one_administrator(roles: None) -> None:
    env = processes.child_env(PORTAL_ADMIN_USERNAME="root", PORTAL_ADMIN_PASSWORD="a long given passphrase")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [LOCK_KEY])  # as a set-up already under way holds it
        set_ups = [
            subprocess.Popen(
                [sys.executable, "manage.py", "setup_once"],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for _ in range(2)
        ]
        time.sleep(6)
        assert [set_up.poll() for set_up in set_ups] == [None, None], "both wait for the lock"
        assert not User.objects.filter(is_superuser=True).exists()
        cursor.execute("SELECT pg_advisory_unlock(%s)", [LOCK_KEY])
    outputs = [set_up.communicate(timeout=120)[0] for set_up in set_ups]
    assert [set_up.returncode for set_up in set_ups] == [0, 0], outputs
    assert all("setup: done" in output for output in outputs)
    assert sorted("created administrator 'root'" in output for output in outputs) == [False, True], outputs
    assert User.objects.get(is_superuser=True).username == "root"
    assert get_application_model().objects.filter(client_id=HUB_CLIENT_ID).count() == 1


def test_a_program_awaiting_set_up_starts_once_it_is_done_and_otherwise_says_what_is_missing(roles: None) -> None:
    """Under docker stack deploy nothing orders the start: the programs wait for the set-up service's work."""
    get_application_model().objects.filter(client_id=HUB_CLIENT_ID).delete()
    env = processes.child_env(PORTAL_HUB_OAUTH_SECRET="a hub secret given to the stack")
    command = [sys.executable, "manage.py", "setup_once", "--await"]
    early = subprocess.run([*command, "--wait", "2"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert early.returncode != 0
    assert "still waiting for the hub's OAuth client to register" in early.stderr, early.stderr
    waiting = subprocess.Popen([*command, "--wait", "90"], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    time.sleep(2)
    assert waiting.poll() is None, "it waits while the set-up is not done"
    done = subprocess.run(
        [sys.executable, "manage.py", "setup_once"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert waiting.wait(timeout=30) == 0
    assert get_application_model().objects.filter(client_id=HUB_CLIENT_ID).count() == 1
