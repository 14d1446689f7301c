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
from tests.helpers.processes import free_port

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
    nowhere = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
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
