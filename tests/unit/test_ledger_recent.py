"""The ledger answers a redelivered command with its events, from a byte-bounded memory."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from events import AddMemory
from events.codec import PLAIN
from events.rules.ledger import LedgerState
from events.topics import EVENTS, REDELIVERED, REPLIES
from settings import Settings
from workers.processors.ledger.processor import LedgerProcessor, RecentCommands

NOW = datetime(2026, 3, 1, tzinfo=UTC)


@given(st.lists(st.lists(st.integers(1, 300), min_size=1, max_size=4), min_size=1, max_size=60), st.integers(1, 2000))
def test_recent_commands_stay_within_the_budget_and_whole(commands, budget):
    recent = RecentCommands(budget)
    for i, sizes in enumerate(commands):
        for n in sizes:
            recent.add(f"c{i}", b"x" * n)
        recent.evict()
        # Only the newest command may take the memory over its budget, and it is never cut.
        assert recent.size <= budget or list(recent.events) == [f"c{i}"]
        assert recent[f"c{i}"] == [b"x" * n for n in sizes]
        assert recent.size == sum(len(r) for raws in recent.events.values() for r in raws)
        # What is kept is a suffix of the commands, oldest first.
        kept = [int(c[1:]) for c in recent.events]
        assert kept == list(range(i - len(kept) + 1, i + 1))


async def test_a_redelivered_command_gets_its_first_events_back():
    ledger = LedgerProcessor(Settings(), codec=PLAIN)
    ledger.states[0], ledger.processed[0] = LedgerState(), RecentCommands()
    cmd = AddMemory(command_id="c1", tenant="t", agent="a", issued_at=NOW, summary="The sky is blue", session="s1")
    first = await ledger.process("memlane.memory.commands", 0, 0, cmd)
    again = await ledger.process("memlane.memory.commands", 0, 1, cmd)
    assert [o.value for o in again] == [o.value for o in first] and first
    # An answer on the replies topic, in the command's partition: the event log keeps the first only.
    assert {o.topic for o in first} == {EVENTS.name} and {(o.topic, o.partition) for o in again} == {(REPLIES.name, 0)}
    assert all((REDELIVERED, b"1") in o.headers for o in again)
    assert len(ledger.states[0].records) == 1


def test_a_command_past_the_byte_budget_stays_in_the_window_until_its_time_is_up():
    recent = RecentCommands(budget=10, window_s=3600)
    recent.add("old", b"x" * 8, "alice", at_ms=1_000)
    recent.add("new", b"y" * 8, "bob", at_ms=2_000)
    recent.evict(now_ms=2_000)
    # Its events gave way to the newer command's; its caller and time stay for the window.
    assert list(recent.events) == ["new"] and "old" in recent
    assert (recent.caller("old"), recent.when("old")) == ("alice", 1_000)
    recent.evict(now_ms=1_000 + 3_600_000)
    assert "old" in recent  # an hour to the millisecond: still in
    recent.evict(now_ms=1_001 + 3_600_000)
    assert "old" not in recent and "new" in recent  # the newest command's events are always held


def test_the_window_keeps_at_most_its_bound_of_older_commands():
    recent = RecentCommands(budget=1, window_s=3600, most=3)
    for i in range(6):
        recent.add(f"c{i}", b"xx", at_ms=1_000 + i)
        recent.evict(now_ms=2_000)
    assert list(recent.older) == ["c2", "c3", "c4"] and list(recent.events) == ["c5"]


def test_a_snapshot_keeps_the_window():
    from collections import OrderedDict

    from workers.processors.ledger.snapshot_file import decode_state, decode_window, encode_state

    recent = RecentCommands(budget=10, window_s=3600)
    recent.add("old", b"x" * 8, "alice", at_ms=1_000)
    recent.add("new", b"y" * 8, "bob", at_ms=2_000)
    recent.evict(now_ms=2_000)
    body = encode_state(LedgerState(), OrderedDict(recent.events), recent.callers, recent.at, recent.window())
    again = RecentCommands.restored(decode_state(body)[1], *decode_window(body))
    assert again.window() == [("old", "alice", 1_000)] and (again.caller("new"), again.when("new")) == ("bob", 2_000)
