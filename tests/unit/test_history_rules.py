"""Session history rules, without I/O: what is kept, parts, rendering, filters, cursors."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from events import Message, ToolCall, TurnCommitted
from events.config import AgentConfig, HistoryConfig
from events.rules.history import (
    HistoryFilter,
    KeptEvent,
    across_conversations,
    decode_cursor,
    encode_cursor,
    event_from_payload,
    header,
    kept_events,
    kinds_for,
    reachable,
    render,
    split_parts,
    time_window,
)

AT = datetime(2026, 9, 19, 12, 0, tzinfo=UTC)


def turn(messages, session="s1", **kw):
    return TurnCommitted(event_id="e1", tenant="t", agent="a", session=session, turn=4, execution_id="x1",
                         occurred_at=AT, messages=messages, **kw)


def test_kept_events_drop_skill_loads_retrievals_system_and_empty_messages():
    t = turn([
        Message(id="s", role="system", content="instructions"),
        Message(id="u", role="user", content="hello"),
        Message(id="k", role="user", content="skill text", origin="skill_load"),
        Message(id="r", role="tool", content="memory hit", origin="retrieval", tool_call_id="c0"),
        Message(id="e", role="assistant", content=""),
        Message(id="a", role="assistant", content="calling", tool_calls=[ToolCall(id="c1", name="look", arguments={"q": 1})]),
        Message(id="tr", role="tool", content="result", tool_call_id="c1", tool_name="look"),
        Message(id="te", role="tool", content="boom", tool_call_id="c1", tool_name="look", is_error=True),
    ])
    kept = {e.id: e for e in kept_events(t)}
    assert list(kept) == ["u", "a", "tr", "te"]
    assert [kept[i].sequence for i in kept] == [1, 5, 6, 7]
    assert kept["a"].text == 'calling\n[called look {"q": 1}]' and kept["a"].calls == ("c1",)
    assert (kept["tr"].kind, kept["tr"].call_id) == ("tool_result", "c1")
    assert kept["te"].kind == "tool_error"
    assert all(e.turn == 4 and e.execution_id == "x1" and e.occurred_ms == int(AT.timestamp() * 1000) for e in kept.values())


def test_an_agent_without_sessions_keeps_nothing():
    assert kept_events(turn([Message(id="u", role="user", content="hi")], session=None)) == []


def test_a_turn_that_ended_failed_keeps_nothing_and_the_others_keep_what_they_said():
    said = [Message(id="u", role="user", content="hi")]
    assert kept_events(turn(said, status="failed")) == []
    for status in ("completed", "stopped", "output_restricted"):
        assert [e.id for e in kept_events(turn(said, status=status))] == ["u"]


def test_index_setting_decides_which_kinds_are_found():
    assert kinds_for("messages") == ("message",)
    assert set(kinds_for("messages_and_tools")) == {"message", "tool_result", "tool_error"}


@given(st.text(min_size=0, max_size=9000), st.integers(min_value=20, max_value=3000))
def test_parts_rejoin_to_the_text_and_respect_the_size(text, size):
    parts = split_parts(text, size)
    assert "".join(parts) == text
    assert all(0 < len(p) <= size for p in parts) or parts == [""]


def test_parts_cut_at_whitespace():
    text = " ".join(["word"] * 1000)
    parts = split_parts(text, 100)
    assert all(p.endswith(" ") for p in parts[:-1])


def event(**kw):
    base = dict(id="m", tenant="t", agent="a", session="s1", turn=12, attempt=1, execution_id="x", sequence=0,
                role="user", kind="message", text="hi", preview=False, occurred_ms=1000)
    return KeptEvent(**{**base, **kw})


def test_header_and_render_name_turn_who_execution_sequence_and_call():
    assert header(event()) == "turn 12, user"
    tool = event(role="tool", kind="tool_error", tool_name="lookup", call_id="c9", sequence=3)
    assert header(tool) == "turn 12, tool lookup error"
    out = render(tool, "part text", 2, 3)
    assert out["text"] == "turn 12, tool lookup error\npart text"
    assert (out["part"], out["parts"], out["call_id"], out["execution_id"], out["sequence"]) == (2, 3, "c9", "x", 3)


def test_filter_admits_only_its_session_earlier_turns_and_live_events_for_live_turns():
    f = HistoryFilter("t", "a", "s1", preview=False, kinds=("message",), before_turn=12)
    assert f.admits(event(turn=11))
    assert not f.admits(event(turn=12))
    assert not f.admits(event(turn=3, session="s2"))
    assert not f.admits(event(turn=3, agent="b"))
    assert not f.admits(event(turn=3, preview=True))
    assert not f.admits(event(turn=3, kind="tool_result"))
    pf = HistoryFilter("t", "a", "s1", preview=True, kinds=("message",))
    assert pf.admits(event(preview=True)) and pf.admits(event())


def test_time_window_day_and_range():
    start, end = time_window("2026-09-19", None, None)
    assert start == int(datetime(2026, 9, 19, tzinfo=UTC).timestamp() * 1000)
    assert end - start == 86_400_000
    assert time_window(None, 5, 10) == (5, 10)
    assert time_window(None, None, None) == (None, None)
    with pytest.raises(ValueError, match="^day:"):
        time_window("19.09.2026", None, None)
    with pytest.raises(ValueError, match="^day:"):
        time_window("2026-09-19", 1, None)
    with pytest.raises(ValueError, match="^until:"):
        time_window(None, 10, 10)


def test_a_cursor_continues_only_the_search_that_made_it():
    c = encode_cursor([12005, "m"], "fp1")
    assert decode_cursor(c, "fp1") == [12005, "m"]
    with pytest.raises(ValueError, match="^cursor: it belongs"):
        decode_cursor(c, "fp2")
    with pytest.raises(ValueError, match="^cursor:"):
        decode_cursor("garbage!", "fp1")


def test_a_stored_part_reads_back_as_written_and_an_old_one_as_it_was():
    from projections.qdrant.history_index import FILTERED, event_parts, pack, unpack

    calls = [ToolCall(id="c1", name="search_memory", arguments={"query": "x"})]
    t = turn([Message(id="m1", role="user", content="Hi there"), Message(id="m2", role="assistant", content="", tool_calls=calls)])
    parts = [p for e in kept_events(t) for _, p in event_parts(e)]
    assert len(parts) == 2
    for payload in parts + [{**parts[0], "execution_id": None}]:
        stored = pack(payload, None)
        assert set(stored) - {"doc"} <= set(FILTERED)
        assert ("execution_id" in stored) == (payload["execution_id"] is not None)  # None is not stored as a key
        assert unpack(stored, None) == payload
        assert unpack(payload, None) == payload


# ----------------------------------------------------------------- whose turns a search sees

READERS = {
    "agent for alice": dict(user="alice"),
    "agent for bob": dict(user="bob"),
    "agent for no member": dict(user=None),
    "operator": dict(user=None, operator=True),
    "operator naming alice": dict(user="alice", operator=True),
}
# Who finds an event of each member (None: a turn of no member).
SEES = {
    "agent for alice": {None, "alice"},
    "agent for bob": {None, "bob"},
    "agent for no member": {None},
    "operator": {None},
    "operator naming alice": {None},
}


def test_kept_events_carry_the_turns_member_and_an_old_stored_event_reads_as_of_none():
    t = turn([Message(id="u", role="user", content="my locker code is 4411")], user="alice")
    [e] = kept_events(t)
    assert e.user == "alice"
    assert KeptEvent.from_json(e.to_json()) == e
    old = json.loads(event().to_json())
    del old["user"]
    assert KeptEvent.from_json(json.dumps(old)).user is None
    assert [x.user for x in kept_events(turn([Message(id="u", role="user", content="hi")]))] == [None]


@pytest.mark.parametrize("reader", list(READERS))
def test_a_members_turns_are_found_only_by_the_agent_speaking_for_that_member(reader):
    f = HistoryFilter("t", "a", "s1", preview=False, kinds=("message",), **READERS[reader])
    seen = {u for u in (None, "alice", "bob") if f.admits(event(user=u))}
    assert seen == SEES[reader]


def test_the_redis_rule_and_the_qdrant_filter_agree_on_whose_turns_are_found(tmp_path):
    from projections.qdrant.history_index import HistoryIndex, event_parts

    index = HistoryIndex(tmp_path / "history", dim=4)
    try:
        events = {u: event(id=f"m-{u}", user=u, text="kestrel budget", sequence=i)
                  for i, u in enumerate((None, "alice", "bob"))}
        rows = [(pid, p, [1.0, 0.0, 0.0, 0.0]) for e in events.values() for pid, p in event_parts(e)]
        # A part written before `user` existed: no key at all, read as of no member.
        old_pid, old = event_parts(event(id="m-old", text="kestrel budget", sequence=3))[0]
        del old["user"]
        rows.append((old_pid, old, [1.0, 0.0, 0.0, 0.0]))
        index.upsert(rows)
        for reader, who in READERS.items():
            f = HistoryFilter("t", "a", "s1", preview=False, kinds=("message",), **who)
            for mode in ("lexical", "vector"):
                hits = index.search(f, [1.0, 0.0, 0.0, 0.0], "kestrel budget", 10, mode=mode)
                found = {h.payload["event_id"] for h in hits}
                admitted = {e.id for e in [*events.values(), event_from_payload(old)] if f.admits(e)}
                assert found == admitted == {f"m-{u}" for u in SEES[reader]} | {"m-old"}, (reader, mode)
                assert all(event_from_payload(h.payload).user in SEES[reader] for h in hits)
    finally:
        index.close()


def test_history_reaches_other_sessions_only_when_on_and_across_conversations():
    assert not across_conversations(AgentConfig())
    assert not across_conversations(AgentConfig(history=HistoryConfig()))
    assert across_conversations(AgentConfig(history=HistoryConfig(across_conversations=True)))
    assert reachable("s1", "s1", across=False) and reachable("s2", "s1", across=True)
    assert not reachable("s2", "s1", across=False) and not reachable("s2", None, across=False)


def test_a_lexical_search_weighs_a_long_part_by_its_length(tmp_path):
    # A 124-token part naming the word three times against a 5-token part naming it once: at
    # the history shard's length normalisation the short part is the better match.
    from itertools import product

    from projections.qdrant.history_index import HistoryIndex, event_parts

    filler = " ".join("".join(w) for w in product("bcdfg", "aeiou", "klmnp"))
    index = HistoryIndex(tmp_path / "history", dim=4)
    try:
        rows = [(pid, p, [1.0, 0.0, 0.0, 0.0]) for e in (event(id="long", text=f"{filler} zebra zebra zebra"),
                                                         event(id="short", text="zebra crossing near harbour gate", sequence=1))
                for pid, p in event_parts(e)]
        index.upsert(rows)
        f = HistoryFilter("t", "a", "s1", preview=False, kinds=("message",))
        hits = index.search(f, None, "zebra", 10, mode="lexical")
        assert [h.payload["event_id"] for h in hits] == ["short", "long"]
    finally:
        index.close()


@pytest.mark.parametrize("mode", ["lexical", "vector"])
def test_a_long_message_is_one_hit_its_best_part_in_every_mode(tmp_path, mode):
    from projections.qdrant.history_index import HistoryIndex, event_parts

    long_text = " ".join(f"zebra paragraph{i} " + "filler " * 60 for i in range(12))  # several parts
    index = HistoryIndex(tmp_path / "history", dim=4)
    try:
        long_parts = event_parts(event(id="long", text=long_text, sequence=0))
        assert len(long_parts) >= 3
        rows = [(pid, p, [1.0, 0.1 * n, 0.0, 0.0]) for n, (pid, p) in enumerate(long_parts)]
        rows += [(pid, p, [0.5, 1.0, 0.0, 0.0]) for pid, p in event_parts(event(id="short", text="zebra " + "crossing " * 100,
                                                                                  sequence=1))]
        rows += [(pid, p, [0.0, 0.0, 1.0, 0.0]) for pid, p in event_parts(event(id="other", text="unrelated words",
                                                                                  sequence=2))]
        index.upsert(rows)
        f = HistoryFilter("t", "a", "s1", preview=False, kinds=("message",))
        page = [h.payload["event_id"] for h in index.search(f, [1.0, 0.0, 0.0, 0.0], "zebra", 2, mode=mode)]
        assert sorted(page) == ["long", "short"]
        # Pages follow one order: the second page starts after the first page's one hit.
        assert [h.payload["event_id"] for n in (0, 1)
                for h in index.search(f, [1.0, 0.0, 0.0, 0.0], "zebra", 1, offset=n, mode=mode)] == page
        if mode == "vector":  # the part shown is the one nearest the query: the first
            [hit] = [h for h in index.search(f, [1.0, 0.0, 0.0, 0.0], "zebra", 2, mode=mode)
                     if h.payload["event_id"] == "long"]
            assert hit.payload["part"] == 1
    finally:
        index.close()
