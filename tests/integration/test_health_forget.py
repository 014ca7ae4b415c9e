"""A worker killed and never restarted stays in /health's registry only for
`worker_forget_s` after its last beat. Real Redis."""

from __future__ import annotations

import time
import uuid

from redis import asyncio as aioredis

from services.http.health_probe import HealthProbe
from tests.redis_at import redis_at
from workers.runtime.heartbeat import heartbeat_key, registry_key, seen_key


async def test_a_worker_gone_past_the_bound_is_forgotten_and_a_recent_one_is_reported_dead(settings):
    # A deployment of its own: the session's stack registers its workers under the run's prefix.
    s = settings.model_copy(update={"worker_forget_s": 60.0, "topic_prefix": f"{settings.topic_prefix}hf{uuid.uuid4().hex[:6]}."})
    r = aioredis.from_url(s.redis_url, decode_responses=True)
    probe = HealthProbe(s, redis_at(s.redis_url))
    try:
        await r.sadd(registry_key(s), "gone", "recent", "old-version")
        await r.hset(seen_key(s), mapping={"gone": time.time() - 3600, "recent": time.time() - 30})
        seen = await probe.observe()
        assert seen.beats == {"recent": None, "old-version": None}
        assert await r.smembers(registry_key(s)) == {"recent", "old-version"}
        # A name registered before beats were timed starts being timed.
        assert set(await r.hkeys(seen_key(s))) == {"recent", "old-version"}
    finally:
        await r.delete(registry_key(s), seen_key(s), heartbeat_key(s, "recent"))
        await probe.close()
        await r.aclose()


async def test_deregister_forgets_a_worker_at_once(settings):
    from workers.runtime.heartbeat import deregister

    settings = settings.model_copy(update={"topic_prefix": f"{settings.topic_prefix}hd{uuid.uuid4().hex[:6]}."})
    r = aioredis.from_url(settings.redis_url, decode_responses=True)
    try:
        await r.sadd(registry_key(settings), "ledger", "history")
        await r.hset(seen_key(settings), mapping={"ledger": time.time(), "history": time.time()})
        await deregister(settings, redis_at(settings.redis_url), "ledger")
        assert await r.smembers(registry_key(settings)) == {"history"}
        assert await r.hkeys(seen_key(settings)) == ["history"]
    finally:
        await r.delete(registry_key(settings), seen_key(settings))
        await r.aclose()
