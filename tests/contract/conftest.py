from __future__ import annotations

import itertools

import pytest

from projections.records import MemoryFold
from projections.redis_records import RedisRecords

_gen = itertools.count(1000)


@pytest.fixture(params=["fold", "redis"])
async def view(request, settings):
    """Every adapter of the record view, fresh for each test."""
    if request.param == "fold":
        yield MemoryFold()
        return
    gen = int(settings.topic_prefix.strip("t.")[-6:], 16) % 10_000_000 * 1000 + next(_gen)
    store = RedisRecords.from_url(settings.redis_url, generation=gen)
    yield store
    keys = [k async for k in store.r.scan_iter(f"ml:g{gen}:*", count=10_000)]
    if keys:
        await store.r.delete(*keys)
    await store.aclose()
