"""The undo law: for any generated log and any command in it whose records no later command
touched, the Redis projection after its undo lists, pins and keeps live exactly what the fold of
the log without that command does; and undoing the undo brings back the state before it."""

from __future__ import annotations

import itertools
from datetime import timedelta

from hypothesis import HealthCheck, assume, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from events.commands import UndoWrites
from events.record import LIVE, Provenance, Source
from events.rules import undo
from events.rules.ledger import LedgerState, decide, evolve
from projections.records import MemoryFold
from projections.redis.record_view import RedisRecords
from tests.integration.test_projection_law import ledger_events, op
from tests.redis_at import redis_at

_gens = itertools.count(9_000_000)
OP = Provenance(source=Source.OPERATOR, modified_by="undo")


def versions_of(events: list) -> list[list[undo.Version]]:
    by_id: dict[str, dict[int, undo.Version]] = {}
    for e in events:
        if hasattr(e, "record") and e.type != "CommandRejected":
            # The first event of a version made it; a later one (a restatement, an unchanged answer)
            # repeats it, and the record view keeps the first too.
            by_id.setdefault(e.record.id, {}).setdefault(e.record.version, undo.Version(e.command_id, e.record))
    return [list(v.values()) for v in by_id.values()]


def untouched_after(events: list, target: str) -> bool:
    """Whether no later command addressed a record `target` changed, even to change nothing (an
    unpin of an unpinned record repeats its version, and the log without `target` would keep it)."""
    mine = {e.record.id for e in events if e.command_id == target and hasattr(e, "record")}
    first = next(i for i, e in enumerate(events) if e.command_id == target)
    return not any(hasattr(e, "record") and e.record.id in mine and e.command_id != target
                   for e in events[first:])


def undone(events: list, target: str, n: int) -> list:
    """The undo of command `target` decided against the state the log folds to."""
    state = LedgerState()
    for e in events:
        evolve(state, e)
    p = undo.plan(versions_of(events), undo.matcher("command", target))
    last = events[-1].occurred_at
    cmd = UndoWrites(command_id=f"undo-{n}", tenant="t", agent="a", issued_at=last + timedelta(seconds=1),
                     target="command", ref=target, changes=p.changes, provenance=OP)
    return decide(state, cmd)


async def shown(view, rids: list[str]) -> dict:
    """What a reader sees: the listing, the pinned, and each record's liveness and pin."""
    out = {}
    for rid in rids:
        r = await view.get("t", "a", rid)
        out[rid] = (r is not None and r.status in LIVE, bool(r and r.pinned and r.status in LIVE))
    page, listing = None, []
    while True:
        page = await view.page("t", "a", 50, page.next_cursor if page else None)
        listing += sorted(r.id for r in page.records)
        if not page.next_cursor:
            break
    out["__listing__"] = sorted(listing)
    out["__pinned__"] = sorted(r.id for r in await view.pinned("t", "a"))
    return out


@hsettings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, min_size=1, max_size=15), data=st.data())
async def test_an_undone_command_leaves_what_the_log_without_it_makes(settings, ops, data):
    events = ledger_events(ops)
    writes = sorted({e.command_id for e in events if hasattr(e, "record") and e.type != "CommandRejected"})
    assume(writes)
    target = data.draw(st.sampled_from(writes))
    assume(untouched_after(events, target))
    rids = sorted({e.record.id for e in events if hasattr(e, "record")})
    first = undone(events, target, 1)
    assert all(e.type != "CommandRejected" for e in first), first
    without = MemoryFold()
    await without.apply([e for e in events if e.command_id != target])
    views = [RedisRecords(redis_at(settings.redis_url)(pooled=True), generation=next(_gens)) for _ in range(2)]
    try:
        await views[0].fill(events + first)
        assert await shown(views[0], rids) == await shown(without, rids)
        # The undo undone: as the log stood before either.
        second = undone(events + first, "undo-1", 2)
        await views[1].fill(events + first + second)
        before = MemoryFold()
        await before.apply(events)
        assert await shown(views[1], rids) == await shown(before, rids)
    finally:
        for view in views:
            keys = [k async for k in view.r.scan_iter(f"ml:g{view.fixed_generation}:*", count=10_000)]
            if keys:
                await view.r.delete(*keys)
            await view.aclose()
