"""The activity view from real Kafka topics into real Redis (workers.followers.activity_follower, projections.redis.activity_view).

Sealed messages (the codec with this test's own data keys) of the three topics are followed
into per-minute counts and per-record recall stats; poison is parked in its topic's DLQ, as the
runner parks it, and counted; and a replay without a checkpoint, by two followers at once (two API processes), counts nothing twice.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from aiokafka import AIOKafkaProducer

from events.codec import Codec
from events.memory import RecordAdded, RecordDeleted, RecordSuperseded
from events.record import Source
from events.rules.activity import minute_of
from events.sealing import SEALED_MARK
from events.topics import EVENTS, REDELIVERED, TURNS, USAGE
from projections.redis.activity_view import ActivityView
from services.bootstrap import keys_at
from tests.dead_letters import dead_letters
from tests.redis_at import redis_at
from tests.unit.test_activity_rules import record_event, refused, retrieved, turn
from workers.followers.activity_follower import ActivityFollower
from workers.runtime.data_keys import open_keys
from workers.runtime.kafka_io import ensure_topics


@pytest.fixture
async def deployment(settings, tmp_path):
    s = settings.model_copy(update={"topic_prefix": f"{settings.topic_prefix}act{uuid.uuid4().hex[:4]}.",
                                    "key_file": tmp_path / "keys" / "memlane.key"})
    await ensure_topics(s)
    keys = await open_keys(s, keys_at(s)())
    producer = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap)
    await producer.start()
    view = ActivityView(redis_at(s.redis_url)(), s.redis_root)
    try:
        yield s, keys, producer, view
    finally:
        mine = [k async for k in view.r.scan_iter(f"{view.root}*", count=10_000)]
        if mine:
            await view.r.delete(*mine)
        await view.aclose()
        await producer.stop()
        await keys.stop()


async def _follow(s, view, keys) -> ActivityFollower:
    f = ActivityFollower(s, view, keys, codec=Codec(keys.keyring))
    await asyncio.wait_for(f.run(until_caught_up=True), 60)
    return f


async def test_the_follower_counts_each_thing_once_however_often_it_is_read(deployment):
    s, keys, producer, view = deployment
    ten, a1, a2 = f"ten{uuid.uuid4().hex[:6]}", "bot", "helpdesk"
    at = (datetime.now(UTC) - timedelta(minutes=5)).replace(second=10, microsecond=0)
    old = at - timedelta(hours=3)

    async def send(topic, m, headers=()):
        await producer.send_and_wait(s.topic(topic.name), Codec(keys.keyring).encode(m), key=topic.key_bytes(m),
                                     headers=list(headers))

    for m in (turn(ten, a1, n=1, at=at), turn(ten, a1, n=1, at=at, rolled_back=True),  # one attempt: one turn
              turn(ten, a1, n=2, at=at), turn(ten, a2, n=1, at=at)):
        await send(TURNS, m)
    added = record_event(RecordAdded, ten, a1, rid="r-new", command="c-replace", at=at)
    for m in (added, record_event(RecordSuperseded, ten, a1, rid="r-old", command="c-replace", at=at),
              record_event(RecordDeleted, ten, a1, rid="r-gone", command="c-delete", at=at),
              record_event(RecordAdded, ten, a1, rid="r-tool", command="c-tool", source=Source.TOOL, at=at)):
        await send(EVENTS, m)
    # The ledger's copy of a redelivered command's event: same command, counted once anyway.
    await send(EVENTS, record_event(RecordAdded, ten, a1, rid="r-copy", command="c-copy", at=at),
               [(REDELIVERED, b"1")])
    for m in (refused("u-ref", ten, a1, at=at), retrieved("u-1", ten, a1, ("r1", "r2"), at=at),
              retrieved("u-2", ten, a1, ("r1",), at=at + timedelta(seconds=20)),
              retrieved("u-3", ten, a1, ("r1",), recall=False, at=at),  # a search, not a recall
              retrieved("u-old", ten, a1, ("r3",), at=old)):  # before the kept minutes: stats only
        await send(USAGE, m)
    for topic in (TURNS, USAGE):
        await producer.send_and_wait(s.topic(topic.name), b"\x00not json", key=f"{ten}/{a1}".encode())
    await keys.flush()
    assert SEALED_MARK in Codec(keys.keyring).encode(added), "the test's events are sealed, as in a deployment"

    async def check(followers):
        chart = await view.series(ten, a1, minutes=60)
        i = chart["minutes"].index(datetime.fromtimestamp(minute_of(at) * 60, UTC).isoformat())
        assert (chart["turns"][i], chart["decisions"][i], chart["recalls"][i]) == (2, 3, 2)
        assert (sum(chart["turns"]), sum(chart["decisions"]), sum(chart["recalls"])) == (2, 3, 2)
        tenant = await view.series(ten, None, minutes=60)
        assert (sum(tenant["turns"]), sum(tenant["decisions"]), sum(tenant["recalls"])) == (3, 3, 2)
        assert sum((await view.series(None, None))["turns"]) >= 3
        stats = await view.recalls_of(ten, a1, ["r1", "r2", "r3", "never"])
        assert {rid: v["count"] for rid, v in stats.items()} == {"r1": 2, "r2": 1, "r3": 1, "never": 0}
        assert stats["r1"]["first"] == at.isoformat() and stats["r1"]["last"] == (at + timedelta(seconds=20)).isoformat()
        assert stats["never"] == {"count": 0, "first": None, "last": None}
        assert all(f.skipped == 2 for f in followers), [f.status() for f in followers]

    first = await _follow(s, view, keys)
    await check([first])
    assert first.poison.parked == 2
    parked = [*await dead_letters(s, TURNS.dlq), *await dead_letters(s, USAGE.dlq)]
    assert [(m.key, dict(m.headers)["consumer_group"]) for m in parked] == [(f"{ten}/{a1}".encode(), first.poison.group.encode())] * 2
    assert {dict(m.headers)["source_topic"] for m in parked} == {s.topic(TURNS.name).encode(), s.topic(USAGE.name).encode()}
    # Read again from a checkpoint: nothing new. Then the checkpoint lost, two processes replay
    # every message at once: the same counts.
    again = await _follow(s, view, keys)
    assert (again.counted, again.skipped) == (0, 0)
    await check([first])
    await view.r.delete(f"{view.root}ckpt")
    replays = await asyncio.gather(_follow(s, view, keys), _follow(s, view, keys))
    await check(replays)
    assert all(f.counted == first.counted == 10 for f in replays)
