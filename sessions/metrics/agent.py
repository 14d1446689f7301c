"""The GPU agent: samples every GPU once a tick, publishes frames, keeps per-minute history.

One agent runs per GPU host (``manage.py gpu_agent``). Each tick it samples
through the GPU backend, builds one fleet frame and one frame per person,
serialises each once and sends it to the channel layer's groups; the latest
fleet frame also goes to a Redis key for /metrics and late joiners. Losing
Redis or the database for a while stops neither sampling nor the other: the
agent logs once, keeps the last known holders, keeps unsaved minutes (an hour
at most) and carries on when they come back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import redis
import redis.asyncio as aioredis
from django.conf import settings
from django.db import close_old_connections, connections

from portal import push
from sessions.gpus.backends.base import GpuBackend
from sessions.gpus.hosts import HostRefused, Node, heartbeat
from sessions.metrics import history
from sessions.metrics.frames import Holders, dumps, fleet_frame, load_holders, personal_frames
from sessions.metrics.models import GpuMinute

log = logging.getLogger(__name__)
T = TypeVar("T")
LATEST_KEY = "metrics:latest"  # a Redis hash: agent name -> its latest fleet frame (text)
LATEST_TTL_S = 60
PUBLISH_TIMEOUT_S = 2.0
HOLDERS_EVERY_S = 2.0
MAX_UNSAVED_MINUTES = 60


def latest_key() -> str:
    prefix = settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"]  # type: ignore[index]
    return f"{prefix}:{LATEST_KEY}"


def latest_frames(timeout_s: float = PUBLISH_TIMEOUT_S) -> dict[str, str]:
    """Each agent's latest fleet frame, as the text it published. Raises redis.RedisError when Redis is away."""
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=timeout_s, decode_responses=True)
    try:
        return {str(agent): str(text) for agent, text in client.hgetall(latest_key()).items()}
    finally:
        client.close()


class Activity:
    """How busy each held device's containers are (0..1), from Docker's CPU counters, read off the tick."""

    def __init__(self, read: Callable[[], dict[str, tuple[float, float]]] | None) -> None:
        self.read = read
        self.previous: dict[str, tuple[float, float]] = {}
        self.at = 0.0
        self.busy: dict[str, float] = {}

    def refresh(self) -> None:
        if self.read is None:
            return
        try:
            now, usage = time.monotonic(), self.read()
        except Exception as error:  # Docker away: keep the last figures
            log.warning("agent: cannot read container CPU use: %s", error)
            return
        elapsed = now - self.at
        busy = {}
        for device, (used, limit) in usage.items():
            before = self.previous.get(device)
            if before and elapsed > 0 and limit > 0:
                busy[device] = max(0.0, min(1.0, (used - before[0]) / elapsed / limit))
        self.previous, self.at, self.busy = usage, now, busy

    def for_holders(self, holders: Iterable[str]) -> dict[str, float]:
        """Held devices with their busy share; a held device with no container reading is idle (0)."""
        return {device: self.busy.get(device, 0.0) for device in holders}


class Agent:
    def __init__(
        self,
        backend: GpuBackend,
        name: str,
        interval_s: float,
        activity: Activity | None = None,
        hosts: dict[str, str] | None = None,
        beats_for: Sequence[str] = (),
    ) -> None:
        self.backend, self.name, self.interval_s = backend, name, interval_s
        self.activity = activity or Activity(None)
        self.hosts = hosts or {}
        self.beats_for, self.node, self.beat_at = list(beats_for), Node.this_machine(), -float("inf")
        self.holders: Holders = {}
        self.holders_at = 0.0
        self.buffer = history.MinuteBuffer()
        self.unsaved: list[list[GpuMinute]] = []
        self.failing: set[str] = set()
        self.ticks = 0
        # One thread for the database and the backend (one DB connection), one for Docker.
        self.db = ThreadPoolExecutor(1, thread_name_prefix="agent-db")
        self.docker = ThreadPoolExecutor(1, thread_name_prefix="agent-docker")
        self.layer: Any = None
        self.redis: aioredis.Redis | None = None

    async def run(self, ticks: int | None = None) -> None:
        self.layer = push.metrics_layer()
        self.redis = aioredis.from_url(settings.REDIS_URL, socket_timeout=PUBLISH_TIMEOUT_S)
        log.info("agent %s: sampling every %.2f s", self.name, self.interval_s)
        next_at = time.monotonic()
        docker_job: asyncio.Future[None] | None = None
        try:
            while ticks is None or self.ticks < ticks:
                if docker_job is None or docker_job.done():
                    docker_job = asyncio.get_running_loop().run_in_executor(self.docker, self.activity.refresh)
                await self.tick()
                next_at += self.interval_s
                delay = next_at - time.monotonic()
                if delay < 0:  # we fell behind (a stall): skip the missed ticks rather than burst
                    next_at, delay = time.monotonic(), 0
                await asyncio.sleep(delay)
        finally:
            await self.close()

    async def close(self) -> None:
        rows = self.buffer.flush()
        if rows:
            self.unsaved.append(rows)
        await self._save_minutes()
        if self.redis is not None:
            await self.redis.aclose()
        await self._in_db_thread(connections.close_all)  # the DB thread's connection goes with it
        self.db.shutdown(wait=True)
        self.docker.shutdown(wait=False)

    async def tick(self) -> dict[str, Any] | None:
        self.ticks += 1
        t = time.time()
        await self._beat()
        await self._refresh_holders()
        try:
            samples = await self._in_db_thread(self.backend.sample, self.activity.for_holders(self.holders))
        except Exception as error:  # the whole backend failed this tick; try again next tick
            self._trouble("sample", error)
            return None
        self._recovered("sample")
        simulated = getattr(self.backend, "name", "") == "simulated"
        frame = fleet_frame(self.name, t, samples, self.holders, self.hosts, simulated)
        await self._publish(frame)
        finished = self.buffer.add(frame, self.holders)
        if finished:
            self.unsaved.append(finished)
            del self.unsaved[:-MAX_UNSAVED_MINUTES]
            await self._save_minutes()
        return frame

    async def _beat(self) -> None:
        """Every PORTAL_HOST_HEARTBEAT_S, a heartbeat for each host this agent serves (sessions.gpus.hosts)."""
        if not self.beats_for or time.monotonic() - self.beat_at < settings.HOST_HEARTBEAT_S:
            return
        try:
            for host in self.beats_for:
                await self._in_db_thread(heartbeat, host, getattr(self.backend, "name", "simulated"), self.node)
        except HostRefused as error:  # another machine beats for it: the operator must rename one
            self._trouble("heartbeat", error)
            return
        except Exception as error:  # the database away: beat again next tick
            self._trouble("database", error)
            return
        self.beat_at = time.monotonic()
        self._recovered("heartbeat")

    async def _refresh_holders(self) -> None:
        if time.monotonic() - self.holders_at < HOLDERS_EVERY_S:
            return
        try:
            self.holders = await self._in_db_thread(load_holders)
            self.holders_at = time.monotonic()
            self._recovered("database")
        except Exception as error:  # keep the last known holders
            self._trouble("database", error)

    async def _publish(self, frame: dict[str, Any]) -> None:
        text = dumps(frame)
        personal = {owner: dumps(mine) for owner, mine in personal_frames(frame, self.holders).items()}
        assert self.redis is not None
        try:
            async with asyncio.timeout(PUBLISH_TIMEOUT_S):
                await push.publish_frames(self.layer, text, personal, frame["t"], self.name)
                await self.redis.hset(latest_key(), self.name, text)
                await self.redis.expire(latest_key(), LATEST_TTL_S)
        except Exception as error:
            self._trouble("redis", error)
            return
        self._recovered("redis")

    async def _save_minutes(self) -> None:
        while self.unsaved:
            try:
                await self._in_db_thread(history.save, self.unsaved[0])
            except Exception as error:
                self._trouble("database", error)
                return
            self.unsaved.pop(0)

    async def _in_db_thread(self, work: Callable[..., T], *args: Any) -> T:
        def call() -> T:
            close_old_connections()  # a connection the database dropped is replaced, not reused
            return work(*args)

        return await asyncio.get_running_loop().run_in_executor(self.db, call)

    def _trouble(self, what: str, error: Exception) -> None:
        if what not in self.failing:
            log.warning("agent %s: %s unavailable, carrying on: %s", self.name, what, error)
            self.failing.add(what)

    def _recovered(self, what: str) -> None:
        if what in self.failing:
            log.info("agent %s: %s is back", self.name, what)
            self.failing.discard(what)
