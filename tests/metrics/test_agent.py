"""The agent in-process: it keeps sampling while Redis is away and publishes again when it is back."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio as aioredis
from channels_redis.pubsub import RedisPubSubChannelLayer
from django.conf import settings

from sessions.gpus.backends import get_backend
from sessions.metrics.agent import Agent, latest_key
from tests.helpers import processes

pytestmark = pytest.mark.django_db(transaction=True)


def test_sampling_goes_on_without_redis_and_publishing_resumes(make_fleet) -> None:  # type: ignore[no-untyped-def]
    make_fleet("agent: 1xH200:mig, 1xL4:whole")
    store = redis.Redis.from_url(settings.REDIS_URL)
    store.delete(latest_key())
    try:
        asyncio.run(outage_and_return(Agent(get_backend(), "agent-test", 0.1), store))
    finally:
        store.delete(latest_key())


async def outage_and_return(agent: Agent, store: redis.Redis) -> None:
    nowhere = f"redis://127.0.0.1:{processes.free_port()}/0"  # nothing listens there
    agent.layer = RedisPubSubChannelLayer(hosts=[nowhere])
    agent.redis = aioredis.from_url(nowhere, socket_connect_timeout=0.5)
    try:
        frames = [await agent.tick() for _ in range(3)]
        assert all(frame is not None and len(frame["gpus"]) == 2 for frame in frames), "sampling went on"
        assert "redis" in agent.failing and not store.exists(latest_key())
        await agent.redis.aclose()
        agent.layer = RedisPubSubChannelLayer(hosts=[settings.REDIS_URL])
        agent.redis = aioredis.from_url(settings.REDIS_URL)
        frame = await agent.tick()
        assert frame is not None and "redis" not in agent.failing, "publishing resumed"
        assert store.hget(latest_key(), "agent-test") is not None
    finally:
        await agent.close()


def test_the_agent_comes_back_after_losing_its_database_connection(make_fleet, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("cuts PostgreSQL connections")
    make_fleet("agent: 1xH200:mig")
    # As manage.py gpu_agent runs: one long-lived, health-checked connection, no pool (undone after the test).
    connection.close()
    options = {key: value for key, value in connection.settings_dict["OPTIONS"].items() if key != "pool"}
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", options)
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", None)
    monkeypatch.setitem(connection.settings_dict, "CONN_HEALTH_CHECKS", True)
    try:
        asyncio.run(database_outage(Agent(get_backend(), "agent-db", 0.1)))
    finally:
        connection.close()  # its own connection, not one borrowed from the pool


async def database_outage(agent: Agent) -> None:
    from django.db import connection

    url = processes.test_database_url()

    agent.layer = RedisPubSubChannelLayer(hosts=[settings.REDIS_URL])
    agent.redis = aioredis.from_url(settings.REDIS_URL)

    def backend_pid() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            return int(cursor.fetchone()[0])

    def cut(pid: int) -> bool:
        """What a database restart does to the agent's connection (from a connection of our own)."""
        import psycopg

        with psycopg.connect(url, autocommit=True) as other:
            found = other.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()
            return bool(found and found[0])

    try:
        assert await agent.tick() is not None
        agents_connection = await agent._in_db_thread(backend_pid)
        assert await asyncio.to_thread(cut, agents_connection)
        # The health check finds the connection dead before it is used and opens another: no tick lost.
        assert await agent.tick() is not None, "the agent reconnects and samples again"
        assert await agent._in_db_thread(backend_pid) != agents_connection
        assert not agent.failing
        assert "database" not in agent.failing and "sample" not in agent.failing
    finally:
        await agent.close()
        redis.Redis.from_url(settings.REDIS_URL).hdel(latest_key(), "agent-db")
