"""The record view's reads the reconciler uses (`RedisRecords.scan_agents`, `listing`,
`current_raw`), against a real Redis: the checkpoint and the listing come from one
transaction, so the listed view is never older than the checkpoint read with it."""

from __future__ import annotations

from datetime import UTC, datetime

from events import RecordAdded
from events.lean import as_lean, decode_lean
from events.record import MemoryRecord
from projections.redis.record_view import RedisRecords
from tests.redis_at import redis_at

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def added(agent: str, rid: str, version: int = 1):
    r = MemoryRecord(id=rid, version=version, created=T0, modified=T0, tenant="t", agent=agent, scope="AGENT",
                     kind="fact", summary=f"{rid} v{version}")
    return as_lean(RecordAdded(event_id=f"e-{rid}-{version}", command_id=f"c-{rid}-{version}", tenant="t",
                               agent=agent, occurred_at=T0, record=r))


async def test_the_reconcilers_reads_of_the_view(settings):
    view = RedisRecords(redis_at(settings.redis_url)(pooled=True), namespace=f"{settings.topic_prefix}reads.")
    try:
        gen = await view.generation()
        await view.apply([added("a", "r1"), added("a", "r2"), added("b", "r3")], [("ev:0", 3), ("ev:0", 4), ("ev:0", 5)])
        await view.apply([added("a", "r1", 2)], [("ev:0", 9)])
        cursor, agents = 0, set()
        while True:
            cursor, page = await view.scan_agents(gen, cursor, 10)
            agents |= set(page)
            if cursor == 0:
                break
        assert agents == {("t", "a"), ("t", "b")}
        view_at, listed = await view.listing(gen, "t", "a", "ev:0")
        assert view_at == 9 and sorted(listed) == ["r1", "r2"]
        raws = await view.current_raw(gen, "t", "a", ["r1", "r2", "unknown"])
        assert sorted((r.id, r.version) for r in (decode_lean(x.encode()).record for x in raws)) == [("r1", 2), ("r2", 1)]
        assert await view.listing(gen, "t", "a", "ev:7") == (0, listed)
    finally:
        for g in await view.generations():
            await view.drop_generation(g)
        await view.aclose()
