"""The extraction worker's cadence state: its in-memory copy decides as Redis alone would.

A worker that keeps the copy, one that starts cold from Redis (a new owner after a
rebalance), and a turn retried at its own offset must all reach the same decisions.
"""

from __future__ import annotations

import uuid

import redis.asyncio as aioredis

from events.config import EveryMessages, ExtractionConfig
from workers.processors.extraction.cadence import ReviewState

EVERY_3 = ExtractionConfig(every=EveryMessages(messages=3))


def msgs(offset: int) -> list[dict[str, str]]:
    return [{"id": f"m{offset}", "role": "user", "content": f"message at {offset}"}]


async def decide(state: ReviewState, session: str, offset: int) -> tuple[bool, list[str], int]:
    seen = await state.observe(0, session, offset, msgs(offset), EVERY_3)
    await seen.saved
    return seen.due.due, [m["id"] for m in seen.due.pending], seen.due.since


async def test_copy_cold_start_and_retry_agree(settings):
    r = aioredis.from_url(settings.redis_url)
    ns = f"{settings.topic_prefix}rs{uuid.uuid4().hex[:6]}."
    try:
        warm = ReviewState(r, namespace=ns)
        offsets = [3, 7, 8, 12, 20, 21, 30]
        first = [await decide(warm, "s", o) for o in offsets]
        # Every third message is reviewed, with the messages since the last review.
        assert [d[0] for d in first] == [False, False, True, False, False, True, False]
        assert first[2][1] == ["m3", "m7", "m8"]

        # Retried at its own offset, a turn decides the same, whatever came after it.
        assert await decide(warm, "s", 12) == first[3]
        assert await decide(warm, "s", 21) == first[5]

        # A new owner reads Redis only: same decisions for the same offsets.
        cold = ReviewState(r, namespace=ns)
        assert await decide(cold, "s", 21) == first[5]
        # Dropping a revoked partition's copy falls back to Redis too.
        warm.forget({0})
        assert not warm.known
        assert await decide(warm, "s", 30) == first[6]
    finally:
        keys = [k async for k in r.scan_iter(f"{ns}*", count=10_000)]
        if keys:
            await r.delete(*keys)
        await r.aclose()


async def test_trimming_keeps_what_a_retry_needs_and_drops_the_rest(settings):
    r = aioredis.from_url(settings.redis_url)
    ns = f"{settings.topic_prefix}rs{uuid.uuid4().hex[:6]}."
    try:
        warm = ReviewState(r, namespace=ns)
        decided = {o: await decide(warm, "s", o) for o in range(1200)}
        assert [o for o in range(12) if decided[o][0]] == [2, 5, 8, 11]
        key = warm.key(0, "s")
        fields = sorted(int(f[2:]) for f in (k.decode() for k in await r.hkeys(key)))
        # The newest review below 1199 - MAX_UNCOMMITTED (500) was at 698: older facts are gone.
        assert fields[0] == 698
        facts = warm.known[key]
        assert facts.turn_offsets[0] == 698 and len(facts.turns) == 502
        # Any offset of the last uncommitted batch, retried warm or cold, decides as it did.
        cold = ReviewState(r, namespace=ns)
        for o in (700, 1000, 1199):
            assert await decide(warm, "s", o) == decided[o]
            assert await decide(cold, "s", o) == decided[o]
    finally:
        keys = [k async for k in r.scan_iter(f"{ns}*", count=10_000)]
        if keys:
            await r.delete(*keys)
        await r.aclose()
