"""Helpers of the view law tests (`test_runs_projection.py`, `test_notes_projection.py`): the
deliveries a projection may get, and dropping the test generations afterwards."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from projections.redis.record_view import RedisRecords


def deliveries(events: list[Any], data: Any) -> list[list[Any]]:
    """`events` in batches of 1 to 4, some batches delivered again from an earlier point (a replay after a crash)."""
    out, i = [], 0
    while i < len(events):
        n = data.draw(st.integers(1, 4))
        out.append(events[i : i + n])
        if data.draw(st.booleans()):
            out.append(events[data.draw(st.integers(0, i)) : i + n])  # a replay after a crash
        i += n
    return out


async def applied_and_filled(inc: RedisRecords, rebuilt: RedisRecords, events: list[Any], data: Any) -> None:
    """`inc` applies `events` as the projection worker may get them (`deliveries`); `rebuilt`
    fills them three at a time, as a rebuild does."""
    for batch in deliveries(events, data):
        await inc.apply(batch)
    for i in range(0, len(events), 3):
        await rebuilt.fill(events[i : i + 3])


async def dropped(*stores: RedisRecords) -> None:
    """The test generations' keys go, and the clients close."""
    for store in stores:
        keys = [k async for k in store.r.scan_iter(f"ml:g{store.fixed_generation}:*", count=10_000)]
        if keys:
            await store.r.delete(*keys)
        await store.aclose()
