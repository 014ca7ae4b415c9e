"""Worker heartbeats, which `/health` reads to tell a dead worker from a quiet one.

Each worker process writes `<root>{workers}:hb:<worker>` (with a TTL) every `heartbeat_s`
seconds, holding its consumer group and source topics, adds its name to `<root>{workers}` and
the time to `<root>{workers}:seen`. One hash tag for the three, so forgetting a worker is one
MULTI/EXEC and `/health` reads every heartbeat with one MGET on a Redis Cluster too (older
versions used other keys: docs/operations/upgrade.md). A graceful stop removes all three; a
crash or kill -9 leaves
the name without a heartbeat, which is how `/health` knows that worker is expected and
dead, until `worker_forget_s` after its last beat (a worker killed and never restarted).
Several processes of one worker share its heartbeat: any of them alive keeps it.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from contextlib import asynccontextmanager

import redis.asyncio as aioredis
import structlog

from projections.redis.connection import Connect
from settings import Settings

log = structlog.get_logger()


def heartbeat_key(settings: Settings, worker: str) -> str:
    return f"{registry_key(settings)}:hb:{worker}"


def registry_key(settings: Settings) -> str:
    return f"{settings.redis_root}{{workers}}"


def seen_key(settings: Settings) -> str:
    """Hash of worker name -> time of its last beat (seconds since the epoch)."""
    return f"{registry_key(settings)}:seen"


async def _beat(r: aioredis.Redis, settings: Settings, worker: str, body: dict) -> None:
    failing = False
    while True:
        try:
            async with r.pipeline(transaction=False) as p:
                p.sadd(registry_key(settings), worker)
                p.hset(seen_key(settings), worker, time.time())
                p.set(heartbeat_key(settings, worker), json.dumps({**body, "at": time.time()}),
                      px=int(settings.heartbeat_ttl_s * 1000))
                await p.execute()
            failing = False
        except Exception as e:  # Redis away: the worker goes on; /health shows it as dead meanwhile
            if not failing:
                log.warning("heartbeat_failed", worker=worker, error=type(e).__name__)
            failing = True
        await asyncio.sleep(settings.heartbeat_s)


async def deregister(settings: Settings, redis: Connect, worker: str) -> None:
    """Forget `worker` at once, as its clean stop would: `memlane worker NAME --deregister`."""
    r = redis(decode_responses=False)
    try:
        await _forget(r, settings, worker)
    finally:
        await r.aclose()


async def _forget(r: aioredis.Redis, settings: Settings, worker: str) -> None:
    async with r.pipeline(transaction=True) as p:
        p.srem(registry_key(settings), worker)
        p.hdel(seen_key(settings), worker)
        p.delete(heartbeat_key(settings, worker))
        await p.execute()


@asynccontextmanager
async def heartbeat(settings: Settings, redis: Connect, worker: str, group: str, topics: list[str]):
    """Beats while the body runs. A clean exit deregisters the worker; an exception keeps it
    registered, so `/health` reports it dead until it runs again."""
    r = redis(decode_responses=False)
    body = {"group": group, "topics": topics, "pid": os.getpid(), "host": socket.gethostname()}
    task = asyncio.create_task(_beat(r, settings, worker, body), name="heartbeat")
    clean = False
    try:
        yield
        clean = True
    finally:
        task.cancel()
        try:
            await task
        except BaseException:
            pass
        if clean:
            try:
                await _forget(r, settings, worker)
            except Exception as e:
                log.warning("heartbeat_deregister_failed", worker=worker, error=type(e).__name__)
        await r.aclose()
