"""apikeys: how soon API keys are served again after Redis loses them (docs/features/api-keys.md).

`redis_loss_recovery_s`: `MEMLANE_BENCH_APIKEYS` keys (default 10,000; one in ten revoked)
issued through the API's key store and follower (workers/followers/api_keys_follower.py) on the local broker and
Redis. Then the deployment's key-store keys are deleted (`ml:<prefix>apikey*`; the local Redis
may be shared, so no FLUSHALL), and the figure runs from the end of that delete until the
Redis view holds every key again:

- `mode: "running"`: the API process keeps running; a resolve meets a key Redis lacks (served
  from the follower's book, counted in `refused_meanwhile`, which must be 0) and the follower
  writes the whole view back.
- `mode: "restart"`: the API process starts after the loss: reading the topic (`catch_up_s`,
  before it serves) and writing the view back.

Checked before a figure is printed: a store reading Redis alone (no book) accepts every live
key with its tenant, agent and role and refuses every revoked one.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid

from projections.redis.api_key_view import ApiKeyView
from projections.redis.connection import scan_keys, unlink_keys
from services.auth import KeyStore
from settings import ROOT, Settings
from tests.bench.common import discard, figure, progress
from tests.redis_at import redis_at
from workers.followers.api_keys_follower import ApiKeyLog

KEYS = int(os.environ.get("MEMLANE_BENCH_APIKEYS", "10000"))
REVOKE_EVERY = 10
ISSUE_AT_ONCE = 200  # concurrent issues: the producer batches their acks=all sends


async def _process(s: Settings, r) -> tuple[ApiKeyLog, KeyStore]:
    log = ApiKeyLog(s, ApiKeyView(r, s.redis_root))
    await log.start()
    return log, KeyStore(r, s.operator_key, s.redis_root, log=log)


async def _wipe(s: Settings, r) -> int:
    names = [k async for k in scan_keys(r, f"{s.redis_root}apikey*")]
    await unlink_keys(r, names)
    return len(names)


async def _check(s: Settings, r, live: list[tuple[str, dict]], revoked: list[str]) -> None:
    alone = KeyStore(r, s.operator_key, s.redis_root)  # Redis only
    for key, entry in live:
        p = await alone.resolve(key)
        if p is None or (p.tenant, p.agent, p.role, p.key_id) != (entry["tenant"], entry["agent"], entry["role"],
                                                                     entry["id"]):
            raise AssertionError(f"key {entry['id']} not served from Redis after the recovery: {p}")
    for key in revoked:
        if await alone.resolve(key) is not None:
            raise AssertionError("a revoked key is served after the recovery")


async def run() -> None:
    run_id = f"benchapikeys{uuid.uuid4().hex[:6]}"
    s = Settings(topic_prefix=f"{run_id}.", data_dir=ROOT / ".run" / run_id, encryption=False)
    r = redis_at(s.redis_url)(pooled=True)  # as the API connects: a bounded pool that waits
    try:
        log, store = await _process(s, r)
        t0 = time.monotonic()
        issued: list[tuple[str, dict]] = []
        for i in range(0, KEYS, ISSUE_AT_ONCE):
            batch = range(i, min(KEYS, i + ISSUE_AT_ONCE))
            issued += await asyncio.gather(*(store.issue(f"t{n // 100}", f"a{n}", "agent") for n in batch))
        revoked = [key for n, (key, entry) in enumerate(issued) if n % REVOKE_EVERY == 0
                   and await store.revoke(entry["tenant"], entry["id"]) is not None]
        live = [(key, entry) for n, (key, entry) in enumerate(issued) if n % REVOKE_EVERY]
        progress(f"{KEYS} keys issued, {len(revoked)} revoked in {time.monotonic() - t0:.1f} s")

        # The process keeps running through the loss.
        log.restored.clear()
        wiped = await _wipe(s, r)
        t0 = time.monotonic()
        refused = sum([await store.resolve(key) is None for key, _ in live[:100]])
        await log.restored.wait()
        running_s = time.monotonic() - t0
        await _check(s, r, live, revoked)
        figure("redis_loss_recovery_s", running_s, "s", KEYS, mode="running", revoked=len(revoked),
               wiped_redis_keys=wiped, refused_meanwhile=refused, check_every_s=log.check_every_s)
        if refused:
            raise AssertionError(f"{refused} live keys refused while the view was gone")
        await log.stop()

        # The process starts after the loss.
        wiped = await _wipe(s, r)
        t0 = time.monotonic()
        log, store = await _process(s, r)
        catch_up_s = time.monotonic() - t0
        await log.restored.wait()
        restart_s = time.monotonic() - t0
        await _check(s, r, live, revoked)
        figure("redis_loss_recovery_s", restart_s, "s", KEYS, mode="restart", revoked=len(revoked),
               wiped_redis_keys=wiped, catch_up_s=round(catch_up_s, 3))
        await log.stop()
        await _wipe(s, r)
    finally:
        await r.aclose()
    discard(s)
