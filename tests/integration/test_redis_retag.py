"""A deployment that kept session history and recall counts under the key names from before
hash tags finds them under the tagged names after its first start: they may no longer be on
the topics a rebuild reads. One server only (a cluster never held the old layout)."""

from __future__ import annotations

import uuid

import pytest

from events.rules.history import HistoryFilter, KeptEvent
from projections.redis.activity_view import ActivityView
from projections.redis.connection import is_cluster
from projections.redis.history_view import RedisHistory, seal_event
from tests.redis_at import redis_at


@pytest.fixture
async def redis(settings):
    r = redis_at(settings.redis_url)()
    if is_cluster(r):
        await r.aclose()
        pytest.skip("a cluster never held the layout before hash tags")
    prefix = f"{settings.topic_prefix}retag{uuid.uuid4().hex[:6]}."
    yield r, prefix
    doomed = [k async for k in r.scan_iter(match=f"ml:{prefix}*", count=10_000)]
    if doomed:
        await r.delete(*doomed)
    await r.aclose()


def kept(i: int, session: str = "s1") -> KeptEvent:
    return KeptEvent(id=f"e{i}", tenant="acme", agent="bot", session=session, turn=i, attempt=1, execution_id="x",
                     sequence=0, role="user", kind="message", text=f"message {i}", preview=False,
                     occurred_ms=1_700_000_000_000 + i)


async def test_history_kept_under_the_old_names_is_moved_and_read(redis):
    r, prefix = redis
    ns = f"ml:{prefix}hist:g1"
    for i in (1, 2):  # as the view wrote them before: `ev:tenant/agent/session`
        e = kept(i)
        await r.hset(f"{ns}:ev:acme/bot/s1", e.id, seal_event(e, None))
        await r.zadd(f"{ns}:ord:acme/bot/s1", {e.id: e.order})
    await r.hset(f"{ns}:ckpt", "turns:0", 7)
    store = RedisHistory(r, prefix, 1)
    assert await store.checkpoints() == {"turns:0": 7}
    assert not await r.exists(f"{ns}:ev:acme/bot/s1", f"{ns}:ord:acme/bot/s1")
    assert await r.exists(f"{ns}:ev:{{acme/bot}}/s1") and await r.exists(f"{ns}:ord:{{acme/bot}}/s1")
    events, _ = await store.page(HistoryFilter(tenant="acme", agent="bot", session="s1", preview=False, kinds=("message",)), 10)
    assert [e.id for e in events] == ["e2", "e1"]
    # Done once: a key of the old layout written afterwards (an old worker still running) stays.
    await r.hset(f"{ns}:ev:acme/bot/s2", "e9", seal_event(kept(9, "s2"), None))
    await RedisHistory(r, prefix, 1).checkpoints()
    assert await r.exists(f"{ns}:ev:acme/bot/s2")


async def test_recall_counts_kept_under_the_old_names_are_moved_and_read(redis):
    r, prefix = redis
    root = f"ml:{prefix}act:"
    await r.pfadd(f"{root}rc:acme/bot/rec1", "u1", "u2")
    await r.zadd(f"{root}rf:acme/bot", {"rec1": 1_000})
    await r.zadd(f"{root}rl:acme/bot", {"rec1": 2_000})
    view = ActivityView(r, f"ml:{prefix}")
    await view.checkpoints()
    got = await view.recalls_of("acme", "bot", ["rec1"])
    assert got["rec1"]["count"] == 2 and got["rec1"]["first"] and got["rec1"]["last"]
    assert not await r.exists(f"{root}rc:acme/bot/rec1", f"{root}rf:acme/bot", f"{root}rl:acme/bot")
