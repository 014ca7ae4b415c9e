"""The projection law for session memory (docs/features/session-memory.md, docs/decisions/0002-projection-law.md): for
any sequence of run writes and summaries, the run view applied incrementally (with replays of
earlier batches after a crash) and a rebuild's fill show the same runs, and both show what the
ledger's own fold says waits for a summary."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from events import AddMemory, AgentConfig, ConfigureAgent
from events.commands import SummarizeRun
from events.rules.ledger import LedgerState, decide, evolve
from events.rules.ledger.runs import run_of
from projections.redis.record_view import RedisRecords
from projections.redis.run_view import RunView
from tests.integration.views import applied_and_filled, dropped
from tests.redis_at import redis_at

# Near now: the view's keys expire (collected by Redis) 49 hours after a run's last write.
T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
RUNS = ["r1", "r2", "r.3"]
_gens = itertools.count(6_000_000)

op = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(RUNS), st.sampled_from(["tea", "coffee", "Lisbon"]), st.booleans()),
    st.tuples(st.just("summarize"), st.sampled_from(RUNS), st.integers(1, 3)),
)


def ledger_events(ops) -> tuple[list, LedgerState]:
    state, events = LedgerState(), []
    cfg = AgentConfig.model_validate({"memory": {"scope": {"write": ["session", "agent"]}}})

    def run(cmd) -> None:
        for e in decide(state, cmd):
            evolve(state, e)
            events.append(e)

    run(ConfigureAgent(command_id="cfg", tenant="t", agent="a", issued_at=T0, config=cfg))
    for i, o in enumerate(ops):
        common = dict(command_id=f"c{i}", tenant="t", agent="a", issued_at=T0 + timedelta(seconds=i))
        if o[0] == "write":
            run(AddMemory(**common, summary=f"{o[2]} {i}", session="s", run=o[1], scope="AGENT" if o[3] else None))
        else:
            _, waiting = (state.runs.get("t/a") or {}).get(run_of(o[1], None), (None, ()))
            if waiting:
                run(SummarizeRun(**common, run=o[1], entry_ids=[eid for eid, _ in waiting][: o[2]], summary=f"S{i}"))
    return events, state


async def shown(view: RunView) -> dict:
    now = T0 + timedelta(hours=2)
    return {run: (await view.read("t", "a", run, now)).as_json() for run in RUNS}


@hsettings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, min_size=1, max_size=20), data=st.data())
async def test_incremental_and_rebuilt_run_views_agree_with_the_ledger(settings, ops, data):
    events, state = ledger_events(ops)
    inc = RedisRecords(redis_at(settings.redis_url)(pooled=True), generation=next(_gens))
    rebuilt = RedisRecords(redis_at(settings.redis_url)(pooled=True), generation=next(_gens))
    try:
        await applied_and_filled(inc, rebuilt, events, data)
        expected = await shown(RunView(rebuilt))
        assert await shown(RunView(inc)) == expected
        for run in RUNS:
            _, waiting = (state.runs.get("t/a") or {}).get(run_of(run, None), (None, ()))
            assert [e["id"] for e in expected[run]["sessionEntries"]] == [eid for eid, _ in waiting]
            summaries = [e.summary for e in events if e.type == "RunSummarized" and e.run == run]
            assert expected[run]["sessionSummary"] == (summaries[-1] if summaries else None)
    finally:
        await dropped(inc, rebuilt)


async def test_a_run_written_again_after_it_expired_shows_only_its_new_entries(settings):
    state, events = LedgerState(), []
    cfg = AgentConfig.model_validate({"memory": {"scope": {"write": ["session", "agent"]}}})
    long_ago = datetime.now(UTC) - timedelta(hours=48, minutes=30)  # expired, but its key lives an hour on
    cmds = [ConfigureAgent(command_id="cfg", tenant="t", agent="a", issued_at=long_ago, config=cfg),
            AddMemory(command_id="c1", tenant="t", agent="a", issued_at=long_ago, summary="old note", run="r"),
            AddMemory(command_id="c2", tenant="t", agent="a", issued_at=T0 + timedelta(minutes=59), summary="new note",
                      run="r")]
    for cmd in cmds:
        for e in decide(state, cmd):
            evolve(state, e)
            events.append(e)
    view = RedisRecords(redis_at(settings.redis_url)(pooled=True), generation=next(_gens))
    try:
        await view.apply(events[:2])
        await view.apply(events[2:])
        shown = (await RunView(view).read("t", "a", "r", T0 + timedelta(hours=1)))
        assert [e.summary for e in shown.entries] == ["new note"]
    finally:
        await dropped(view)
