"""The projection law (docs/decisions/0002-projection-law.md): for any event sequence with duplicates and
redeliveries, the incremental Redis projection, a fresh rebuild and the pure fold agree.
A rebuild writes with `fill`, which keeps versions itself instead of asking Redis."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from events import AddMemory, AgentConfig, ConfigureAgent, DeleteMemory, PinMemory, UnpinMemory
from events.commands import MergeEvidence, RecordUsage
from events.record import Provenance, Source
from events.rules.ledger import LedgerState, decide, evolve
from projections.records import MemoryFold
from projections.redis.record_view import RedisRecords
from tests.redis_at import redis_at

T0 = datetime(2026, 1, 1, tzinfo=UTC)
_gens = itertools.count(5_000_000)
SUMMARIES = ["tea", "coffee", "Lisbon", "Porto", "dark mode", "SETL-2291"]

op = st.one_of(
    st.tuples(st.just("add"), st.sampled_from(SUMMARIES), st.sampled_from([None, 0, 1, 2]), st.booleans()),
    st.tuples(st.just("delete"), st.integers(0, 5)),
    st.tuples(st.just("pin"), st.integers(0, 5)),
    st.tuples(st.just("unpin"), st.integers(0, 5)),
    st.tuples(st.just("use"), st.integers(0, 5), st.integers(1, 3)),  # RecordUsage: a count, no version
    # Writes of runs (executions): restatements confirm, decisions promote, an episode links.
    st.tuples(st.just("said"), st.sampled_from(["ship on Tuesdays", "restore from the replica"]),
              st.sampled_from(["fact", "decision"]), st.booleans()),
    st.tuples(st.just("episode"), st.integers(0, 2)),
    # A near-duplicate write naming a record the API found (docs/features/near-duplicate-merge.md): the
    # ledger merges it when its own check agrees, else adds it.
    st.tuples(st.just("near"), st.sampled_from(SUMMARIES), st.integers(0, 5)),
)


def ledger_events(ops) -> list:
    """Decide each command against the state so far: deletes, pins and replaces name
    records that earlier commands made."""
    state, events, ids = LedgerState(), [], []
    cfg = AgentConfig.model_validate({"memory": {"pinned": {"max_tokens": 40}, "kinds": ["fact", "decision"]}})

    def run(cmd) -> None:
        for e in decide(state, cmd):
            evolve(state, e)
            events.append(e)
            if e.type == "RecordAdded" and e.record.id not in ids:
                ids.append(e.record.id)

    run(ConfigureAgent(command_id="cfg", tenant="t", agent="a", issued_at=T0, config=cfg))
    for i, o in enumerate(ops):
        common = dict(command_id=f"c{i}", tenant="t", agent="a", issued_at=T0 + timedelta(seconds=i))
        if o[0] == "add":
            replaces = ids[o[2]] if o[2] is not None and o[2] < len(ids) else None
            run(AddMemory(**common, summary=o[1], session="s", replaces=replaces, pinned=o[3]))
        elif o[0] in ("said", "episode"):
            source, kind = (Source.CONSOLIDATION, "episode") if o[0] == "episode" else (
                Source.EXTRACTION if o[3] else Source.TOOL, o[2])
            prov = Provenance(source=source, session="s", execution_id=f"x{o[1] if o[0] == 'episode' else i % 3}")
            run(AddMemory(**common, summary=f"run {i}" if o[0] == "episode" else o[1], session="s", kind=kind,
                          confidence=0.9, provenance=prov))
        elif o[0] == "near" and ids:
            prov = Provenance(source=Source.TOOL, session="s", execution_id=f"x{i % 3}")
            ev = MergeEvidence(record_id=ids[o[2] % len(ids)], similarity=0.95, overlap=1.0, age_s=0.0)
            run(AddMemory(**common, summary=f"The {o[1]}!", session="s", provenance=prov, merge=ev))
        elif o[0] == "use" and ids:
            run(RecordUsage(**common, counts={ids[o[1] % len(ids)]: o[2]}, usage_partition=0, from_offset=i,
                            through_offset=i))
        elif ids:
            cls = {"delete": DeleteMemory, "pin": PinMemory, "unpin": UnpinMemory}[o[0]]
            run(cls(**common, record_id=ids[o[1] % len(ids)], session="s"))
    return events


async def snapshot(view, rids) -> dict:
    out = {}
    for rid in rids:
        out[rid] = [r.model_dump() for r in await view.history("t", "a", rid)]
        out[f"{rid}#current"] = (r := await view.get("t", "a", rid)) and r.model_dump()  # with its usage count
    listing, cursor = [], None
    while True:
        page = await view.page("t", "a", 3, cursor)
        listing += [r.id for r in page.records]
        if not (cursor := page.next_cursor):
            break
    out["__listing__"] = listing
    out["__pinned__"] = [r.id for r in await view.pinned("t", "a")]
    return out


@hsettings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, min_size=1, max_size=25), data=st.data())
async def test_incremental_rebuild_and_fold_agree(settings, ops, data):
    events = ledger_events(ops)
    rids = sorted({e.record.id for e in events if hasattr(e, "record")})
    # Deliveries: the log in order, in chunks, with random redeliveries of earlier chunks.
    deliveries, i = [], 0
    while i < len(events):
        n = data.draw(st.integers(1, 4))
        deliveries.append(events[i : i + n])
        if data.draw(st.booleans()):
            start = data.draw(st.integers(0, i))
            deliveries.append(events[start : i + n])  # a redelivery after a crash
        i += n
    # A log as the ledger writes it: a redelivered command's events again, after their originals.
    log = []
    for i, e in enumerate(events):
        log.append(e)
        if data.draw(st.booleans()):
            log.append(events[data.draw(st.integers(0, i))])
    fold = MemoryFold()
    await fold.apply(events)
    inc = RedisRecords(redis_at(settings.redis_url)(pooled=True), generation=next(_gens))
    rebuilt = RedisRecords(redis_at(settings.redis_url)(pooled=True), generation=next(_gens))
    try:
        for batch in deliveries:
            await inc.apply(batch)
        for i in range(0, len(log), 3):
            await rebuilt.fill(log[i : i + 3])
        expected = await snapshot(fold, rids)
        assert await snapshot(inc, rids) == expected
        assert await snapshot(rebuilt, rids) == expected
    finally:
        for store in (inc, rebuilt):
            keys = [k async for k in store.r.scan_iter(f"ml:g{store.fixed_generation}:*", count=10_000)]
            if keys:
                await store.r.delete(*keys)
            await store.aclose()
