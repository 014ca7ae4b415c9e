"""A follower's park never holds its fold for long: with the broker unreachable, each park gives
up within its bound, and a producer whose start failed is not kept for the next park (a producer
that never connected would wait for metadata forever)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from events.codec import PLAIN
from events.topics import TURNS
from settings import Settings
from workers.runtime import follower_poison
from workers.runtime.dlq import REPLAY_FOR
from workers.runtime.follower_poison import FollowerPoison


def _message(offset: int) -> SimpleNamespace:
    return SimpleNamespace(topic="memlane.turns", partition=0, offset=offset, key=b"t/a/s", value=b"\x00not json",
                           headers=[])


async def test_parks_against_an_unreachable_broker_each_give_up_within_the_bound(monkeypatch):
    monkeypatch.setattr(follower_poison, "PARK_TIMEOUT_S", 1.0)
    poison = FollowerPoison(Settings(kafka_bootstrap="127.0.0.1:9"), "activity", PLAIN)
    t0 = time.monotonic()
    for offset in (1, 2):  # the second park must not reuse the producer that never started
        await asyncio.wait_for(poison.park(TURNS.name, _message(offset), "$: Invalid JSON"), 10)
    assert poison.parked == 0 and poison._producer is None
    assert time.monotonic() - t0 < 10
    await poison.aclose()


def test_a_replay_for_another_group_is_skipped_and_one_for_this_follower_is_not():
    poison = FollowerPoison(Settings(topic_prefix="p."), "activity", PLAIN)
    m = _message(1)
    assert not poison.for_another(m)
    m.headers = [(REPLAY_FOR, b"memlane.p.extraction")]
    assert poison.for_another(m)
    m.headers = [(REPLAY_FOR, poison.group.encode())]
    assert not poison.for_another(m)
