from __future__ import annotations

import itertools

import pytest

from projections.records import MemoryFold
from projections.redis.record_view import RedisRecords
from tests.redis_at import redis_at

_gen = itertools.count(1000)


class FilledRecords(RedisRecords):
    """The Redis view written the way a rebuild fills a generation (`fill`)."""

    async def apply(self, events, positions=None):
        await self.fill(events, positions)


@pytest.fixture(params=["fold", "redis", "redis-fill"])
async def view(request, settings):
    """Every adapter of the record view, fresh for each test."""
    if request.param == "fold":
        yield MemoryFold()
        return
    gen = int(settings.topic_prefix.strip("t.")[-6:], 16) % 10_000_000 * 1000 + next(_gen)
    cls = FilledRecords if request.param == "redis-fill" else RedisRecords
    store = cls(redis_at(settings.redis_url)(pooled=True), generation=gen)
    yield store
    keys = [k async for k in store.r.scan_iter(f"ml:g{gen}:*", count=10_000)]
    if keys:
        await store.r.delete(*keys)
    await store.aclose()
