"""The projection law for notes (docs/features/notes.md, docs/decisions/0002-projection-law.md): for any sequence of saves,
stale saves, forgets and erasures, the note view applied incrementally (with replays of earlier
batches after a crash) and a rebuild's fill hold the same notes, and both hold exactly the notes
and revisions the ledger's own fold keeps."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from events import AgentConfig, ConfigureAgent
from events.commands import EraseSubject, ForgetNote, SaveNote
from events.record import Provenance, Source
from events.rules.ledger import LedgerState, decide, evolve
from events.rules.ledger.notes import owner_key, revision_of
from projections.redis.note_view import NoteView
from projections.redis.record_view import RedisRecords
from tests.integration.views import applied_and_filled, dropped
from tests.redis_at import redis_at

T0 = datetime(2026, 12, 2, tzinfo=UTC)
NOTES = ["n1", "n2", "n.3"]
USERS = [None, "u1", "u2"]
_gens = itertools.count(7_000_000)

op = st.one_of(
    # A save naming the current revision, or a stale (or wrong) one the ledger refuses.
    st.tuples(st.just("save"), st.sampled_from(NOTES), st.sampled_from(USERS), st.booleans(),
              st.sampled_from(["tea", "coffee", "Lisbon"])),
    # A forget of a note that exists (the n-th the ledger holds), or of one that does not.
    st.tuples(st.just("forget"), st.integers(0, 8), st.booleans()),
    st.tuples(st.just("erase"), st.sampled_from(["u1", "u2"])),
)


def ledger_events(ops) -> tuple[list, LedgerState]:
    state, events = LedgerState(), []

    def run(cmd) -> None:
        for e in decide(state, cmd):
            evolve(state, e)
            events.append(e)

    run(ConfigureAgent(command_id="cfg", tenant="t", agent="a", issued_at=T0,
                       config=AgentConfig.model_validate({"history": {}})))
    for i, o in enumerate(ops):
        common = dict(command_id=f"c{i}", tenant="t", agent="a", issued_at=T0 + timedelta(seconds=i))
        if o[0] == "save":
            current = revision_of(state, "t/a", o[2], o[1])
            run(SaveNote(**common, user=o[2], note_id=o[1], topic=f"{o[4]} {i}", summary=f"about {o[4]}",
                         sources=[{"conversation": "s1", "id": f"m{i}"}],
                         expected_revision=current if o[3] else current + 1, session="s1"))
        elif o[0] == "forget":
            held = sorted(((user, nid) for user in USERS for nid in state.notes.get(owner_key("t/a", user)) or {}),
                          key=lambda un: (un[0] or "", un[1]))
            user, note_id = held[o[1] % len(held)] if held and o[2] else (USERS[o[1] % 3], NOTES[o[1] % 3])
            run(ForgetNote(**common, user=user, note_id=note_id))
        else:
            run(EraseSubject(**common, user=o[1], provenance=Provenance(source=Source.OPERATOR)))
    return events, state


async def shown(store: RedisRecords) -> dict:
    view = NoteView(store)
    return {user: sorted((n.id, n.revision, n.topic, n.sources) for n in await view.all("t", "a", user))
            for user in USERS}


@hsettings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, min_size=1, max_size=25), data=st.data())
async def test_incremental_and_rebuilt_note_views_agree_with_the_ledger(settings, ops, data):
    events, state = ledger_events(ops)
    inc = RedisRecords(redis_at(settings.redis_url)(pooled=True), generation=next(_gens))
    rebuilt = RedisRecords(redis_at(settings.redis_url)(pooled=True), generation=next(_gens))
    try:
        await applied_and_filled(inc, rebuilt, events, data)
        expected = await shown(rebuilt)
        assert await shown(inc) == expected
        for user in USERS:
            held = state.notes.get(owner_key("t/a", user)) or {}
            assert [(nid, rev) for nid, rev, _, _ in expected[user]] == sorted((k, v[0]) for k, v in held.items())
    finally:
        await dropped(inc, rebuilt)


async def test_an_agents_removal_drops_every_note_of_the_agent_and_only_its(settings):
    from events.commands import RemoveAgent

    state, events = LedgerState(), []
    cmds = [ConfigureAgent(command_id="cfg", tenant="t", agent=a, issued_at=T0,
                           config=AgentConfig.model_validate({"history": {}})) for a in ("a", "b")]
    cmds += [SaveNote(command_id=f"s{a}{u}", tenant="t", agent=a, issued_at=T0, user=u, note_id="n", topic="t",
                      summary="s", sources=[{"conversation": "s", "id": "m"}], expected_revision=0)
             for a in ("a", "b") for u in USERS]
    cmds.append(RemoveAgent(command_id="rm", tenant="t", agent="a", issued_at=T0,
                            provenance=Provenance(source=Source.OPERATOR)))
    for cmd in cmds:
        for e in decide(state, cmd):
            evolve(state, e)
            events.append(e)
    view = RedisRecords(redis_at(settings.redis_url)(pooled=True), generation=next(_gens))
    try:
        await view.apply(events)
        notes = NoteView(view)
        assert [await notes.all("t", "a", u) for u in USERS] == [[], [], []]
        assert [len(await notes.all("t", "b", u)) for u in USERS] == [1, 1, 1]
    finally:
        await dropped(view)
