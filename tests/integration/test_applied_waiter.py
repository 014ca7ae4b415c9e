"""Read-your-writes waits on what the record view announces, against real Redis: a waiter
reads the view once on arrival and once per announcement that concerns it, never in a loop."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from events import BlockChanged, RecordAdded
from projections.redis.applied_waiter import block_key, record_key
from projections.redis.record_view import RedisRecords
from tests.contract.test_record_view import T0, ev, rec
from tests.redis_at import redis_at

_gen = itertools.count(1)


@pytest.fixture
async def views(settings):
    """The worker's store (announcing), the API's (listening), and a silent one, on one
    generation of their own."""
    gen = int(settings.topic_prefix.strip("t.")[-6:], 16) % 10_000_000 * 1000 + 500 + next(_gen)
    ns = settings.topic_prefix
    worker = RedisRecords(redis_at(settings.redis_url)(pooled=True), generation=gen, namespace=ns, announce=True)
    api = RedisRecords(redis_at(settings.redis_url)(pooled=True), generation=gen, namespace=ns)
    silent = RedisRecords(redis_at(settings.redis_url)(pooled=True), generation=gen, namespace=ns)
    yield worker, api, silent
    keys = [k async for k in worker.r.scan_iter(f"ml:{ns}g{gen}:*", count=10_000)]
    if keys:
        await worker.r.delete(*keys)
    for store in (worker, api, silent):
        await store.aclose()


class Calls(list):
    """When a check was called; `looked` is set at its first call (a barrier, not a sleep)."""

    def __init__(self) -> None:
        super().__init__()
        self.looked = asyncio.Event()


def counted(check):
    calls = Calls()

    async def shown() -> bool:
        calls.append(time.monotonic())
        calls.looked.set()
        return await check()

    return shown, calls


async def test_a_waiter_wakes_when_the_worker_applies_the_version(views):
    worker, api, _ = views
    await worker.apply([ev(RecordAdded, rec("r1"))])

    async def at(version: int) -> bool:
        r = await api.get("t", "a", "r1")
        return bool(r and r.version >= version)

    shown, calls = counted(lambda: at(3))
    waiting = asyncio.ensure_future(api.applied().wait(record_key("t", "a", "r1"), shown, 20, version=3))
    await asyncio.wait_for(calls.looked.wait(), 5)  # until the waiter has subscribed and looked once

    async def other_at_5() -> bool:
        r = await api.get("t", "a", "r2")
        return bool(r and r.version >= 5)

    # A barrier, not a sleep: a waiter on another record looks once, then is woken by the one
    # subscription's announcement of r2; the r1 waiter heard that announcement too, and stays.
    other_shown, other_calls = counted(other_at_5)
    other = asyncio.ensure_future(api.applied().wait(record_key("t", "a", "r2"), other_shown, 20, version=5))
    await asyncio.wait_for(other_calls.looked.wait(), 5)
    await worker.apply([ev(RecordAdded, rec("r2", 5))])  # another record: wakes nobody waiting on r1
    assert await asyncio.wait_for(other, 5) is True
    assert len(calls) == 1 and not waiting.done()
    await worker.apply([ev(RecordAdded, rec("r1", 2))])  # below the version waited for
    t0 = time.monotonic()
    await worker.apply([ev(RecordAdded, rec("r1", 3))])
    assert await asyncio.wait_for(waiting, 5) is True
    assert time.monotonic() - t0 < 1.0
    assert len(calls) == 2, "the view is read on arrival and on the announcement of version 3 only"


async def test_a_version_already_applied_answers_at_once(views):
    worker, api, _ = views
    await worker.apply([ev(RecordAdded, rec("r1"))])

    async def shown() -> bool:
        return (await api.get("t", "a", "r1")) is not None

    assert await api.applied().wait(record_key("t", "a", "r1"), shown, 5)


async def test_a_block_waiter_wakes_on_its_change(views):
    worker, api, _ = views
    change = BlockChanged(event_id="b1", command_id="c-b1", tenant="t", agent="a", occurred_at=T0,
                          label="persona", text="terse")

    async def shown() -> bool:
        return (await api.blocks("t", "a")).get("persona") == "terse"

    looked, calls = counted(shown)
    waiting = asyncio.ensure_future(api.applied().wait(block_key("t", "a", "persona"), looked, 20))
    await asyncio.wait_for(calls.looked.wait(), 5)  # until the waiter has subscribed and looked once
    assert not waiting.done()
    await worker.apply([change])
    assert await asyncio.wait_for(waiting, 5) is True


async def test_without_an_announcement_the_wait_times_out_after_two_reads(views):
    _, api, silent = views

    async def at(version: int) -> bool:
        r = await api.get("t", "a", "r1")
        return bool(r and r.version >= version)

    shown, calls = counted(lambda: at(1))
    await silent.apply([ev(RecordAdded, rec("r0"))])  # written, but not announced, and not r1
    t0 = time.monotonic()
    assert await api.applied().wait(record_key("t", "a", "r1"), shown, 1.0) is False
    assert 0.9 < time.monotonic() - t0 < 3
    assert len(calls) == 2, "one read on arrival, one at the deadline: no polling"
