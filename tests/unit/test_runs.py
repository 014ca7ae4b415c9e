"""Session memory (runs): the pure rules of `events.rules.runs`, and the ledger's decide/evolve
of run entries and summaries, a replay and a snapshot. Pure: no broker, no store."""

from collections import OrderedDict
from datetime import UTC, datetime, timedelta
from itertools import count

import pytest
from pydantic import ValidationError

from events import AddMemory, AgentConfig, ConfigureAgent
from events.codec import decode, encode
from events.commands import SummarizeRun
from events.lean import decode_ledger_view
from events.rules import runs
from events.rules.ledger import LedgerState, decide, evolve
from events.rules.model_answer import Malformed
from services.http.routes.memory import AddRequest
from workers.processors.ledger.snapshot_file import decode_state, encode_state

T0 = datetime(2026, 12, 1, tzinfo=UTC)
H = timedelta(hours=1)
_ids = count()


def nid():
    return f"r{next(_ids)}"


def entry(i, at, chars=10):
    return runs.Entry(id=f"e{i}", at=at, summary="x" * chars)


# ------------------------------------------------------------------ pure rules


def test_session_expires_48h_after_the_runs_last_write_not_the_entrys_own():
    """An entry written at t0 in a run last written at t0+40h is there at t0+50h (past its
    own 48 h) and gone at t0+88h+1s: 48 h after the run's last write."""
    first, last = entry(1, T0), entry(2, T0 + 40 * H)
    run_last_write = max(e.at for e in (first, last))
    shown, summary = runs.visible([first, last], "S", run_last_write, T0 + 50 * H)
    assert [e.id for e in shown] == ["e1", "e2"] and summary == "S"
    shown, summary = runs.visible([first, last], "S", run_last_write, T0 + 88 * H)
    assert [e.id for e in shown] == ["e1", "e2"]  # exactly 48 h: still there
    assert runs.visible([first, last], "S", run_last_write, T0 + 88 * H + timedelta(seconds=1)) == ([], None)
    assert runs.expires_at(run_last_write) == T0 + 88 * H
    assert not runs.expired(run_last_write, T0 + 50 * H)
    assert runs.expired(run_last_write, T0 + 88 * H + timedelta(seconds=1))


def test_a_run_never_written_shows_nothing():
    assert runs.visible([], None, None, T0) == ([], None)


@pytest.mark.parametrize("bad", ["x" * 129, "a/b", "", "a b", "a:b"])
def test_a_run_id_is_1_to_128_letters_digits_dot_underscore_dash(bad):
    with pytest.raises(ValidationError) as e:
        AddMemory(command_id="c", tenant="t", agent="a", issued_at=T0, summary="s", run=bad)
    assert e.value.errors()[0]["loc"] == ("run",)
    with pytest.raises(ValidationError) as e:
        AddRequest(summary="s", run_id=bad)
    assert e.value.errors()[0]["loc"] == ("run_id",)


def test_good_run_ids_pass():
    for ok in ("x" * 128, "run-1.a_B", "7"):
        assert AddMemory(command_id="c", tenant="t", agent="a", issued_at=T0, summary="s", run=ok).run == ok


def test_the_buffer_compresses_past_12_entries_or_4000_characters():
    assert not runs.needs_compression(12, 4000)
    assert runs.needs_compression(13, 10)
    assert runs.needs_compression(2, 4001)


def test_a_compression_keeps_the_newest_entries_raw():
    entries = [entry(i, T0 + i * H) for i in range(13)]
    older = runs.to_compress(list(reversed(entries)))  # whatever order it is given
    assert [e.id for e in older] == [f"e{i}" for i in range(9)]  # the newest 4 stay
    big = [entry(0, T0, 2000), entry(1, T0 + H, 1000), entry(2, T0 + 2 * H, 1000), entry(3, T0 + 3 * H, 1000)]
    assert [e.id for e in runs.to_compress(big)] == ["e0", "e1", "e2"]  # 1,500 characters kept at most
    assert [e.id for e in runs.to_compress([entry(0, T0, 5000)])] == ["e0"]  # too long to keep


def test_the_answer_parses_and_is_clipped():
    assert runs.parse_answer('{"summary": " done "}').summary == "done"
    assert len(runs.parse_answer('{"summary": "%s"}' % ("y" * 5000)).summary) == runs.SUMMARY_CHARS
    for bad in ('{"summary": ""}', "[]", "not json", '{"other": 1}'):
        with pytest.raises(Malformed):
            runs.parse_answer(bad)


def test_the_prompt_holds_the_previous_summary_and_the_entries():
    msgs = runs.build_messages("r1", "before", [entry(1, T0)])
    assert msgs[0]["role"] == "system" and runs.MARKER in msgs[1]["content"]
    assert "<previous_summary>\nbefore" in msgs[1]["content"] and "xxxxxxxxxx" in msgs[1]["content"]


def test_the_summarize_command_id_follows_the_run_and_its_entries():
    a = runs.summarize_command("t", "a", "r1", ["e2", "e1"], "S", T0)
    b = runs.summarize_command("t", "a", "r1", ["e1", "e2"], "other text", T0 + H)
    c = runs.summarize_command("t", "a", "r1", ["e1"], "S", T0)
    assert a.command_id == b.command_id != c.command_id
    assert a.provenance.source.value == "CONSOLIDATION"


# ------------------------------------------------------------------ the ledger


class Ledger:
    def __init__(self, write=("session", "agent")):
        self.state = LedgerState()
        self.log = []
        self.run_cmd(ConfigureAgent(command_id=nid(), tenant="t", agent="a", issued_at=T0,
                                    config=AgentConfig.model_validate({"memory": {"scope": {"write": list(write)}}})))

    def run_cmd(self, cmd):
        events = decide(self.state, cmd)
        for e in events:
            evolve(self.state, e)
        self.log.extend(events)
        return events

    def write(self, summary="note", at=T0, run="r1", **kw):
        return self.run_cmd(AddMemory(command_id=kw.pop("command_id", nid()), tenant="t", agent="a", issued_at=at,
                                      summary=summary, run=run, session="s1", **kw))

    def summarize(self, ids, at=T0, run="r1", summary="S"):
        return self.run_cmd(SummarizeRun(command_id=nid(), tenant="t", agent="a", issued_at=at, run=run,
                                         entry_ids=ids, summary=summary))


def test_a_run_only_write_is_a_run_entry_and_no_record():
    led = Ledger()
    (e,) = led.write("Dana likes tea", content="green")
    assert e.type == "RunEntryAdded" and e.record_id is None and e.run == "r1"
    assert (e.pending_entries, e.pending_chars, e.run_last_write) == (1, len("Dana likes tea") + 5, T0)
    assert not led.state.records
    (e2,) = led.write("more", at=T0 + H)
    assert (e2.pending_entries, e2.run_last_write) == (2, T0 + H)
    assert e2.entry_id == runs.entry_id_for("t", "a", e2.command_id) != e.entry_id


def test_a_write_with_a_scope_is_stored_durably_and_recorded_in_the_run():
    led = Ledger()
    added, entry_ev = led.write("Dana's timezone is CET", scope="AGENT")
    assert added.type == "RecordAdded" and added.record.scope.value == "AGENT"
    assert entry_ev.type == "RunEntryAdded" and entry_ev.record_id == added.record.id
    assert len(led.state.records) == 1


def test_a_refused_durable_write_records_nothing_in_the_run():
    led = Ledger(write=("session",))
    (e,) = led.write("x", scope="AGENT")
    assert e.type == "CommandRejected"
    assert not led.state.runs


def test_a_write_without_a_run_is_as_before():
    led = Ledger()
    (e,) = led.run_cmd(AddMemory(command_id=nid(), tenant="t", agent="a", issued_at=T0, summary="s", session="s1"))
    assert e.type == "RecordAdded"
    assert not led.state.runs


def test_an_undeclared_kind_is_refused_for_a_run_entry_too():
    (e,) = Ledger().write("x", kind="nonsense")
    assert e.type == "CommandRejected" and e.field == "kind"


def test_a_summary_takes_the_waiting_entries_and_only_those():
    led = Ledger()
    ids = [led.write(f"n{i}", at=T0 + i * H)[0].entry_id for i in range(3)]
    (s,) = led.summarize(ids[:2], at=T0 + 3 * H)
    assert s.type == "RunSummarized" and s.entry_ids == ids[:2] and s.run_last_write == T0 + 2 * H
    (nxt,) = led.write("n3", at=T0 + 4 * H)
    assert nxt.pending_entries == 2  # n2 and n3
    (again,) = led.summarize(ids[:2], at=T0 + 5 * H)
    assert again.type == "CommandRejected" and again.field == "entry_ids"


def test_an_expired_run_starts_over():
    led = Ledger()
    (first,) = led.write("old", at=T0)
    (second,) = led.write("older still", at=T0 + H)
    (late,) = led.write("new", at=T0 + 49 * H + H)
    assert (late.pending_entries, late.run_last_write) == (1, T0 + 50 * H)
    # The view drops what it kept of the run at a write that starts it (again).
    assert (first.starts_run, second.starts_run, late.starts_run) == (True, False, True)
    (s,) = led.summarize([late.entry_id], at=T0 + 99 * H)
    assert s.type == "CommandRejected" and s.field == "run"


def test_each_write_keeps_every_entry_of_the_run_alive():
    """The ledger's count follows the run's last write too: an entry from t0 still waits for a
    summary at t0+50h when the run was written at t0+40h."""
    led = Ledger()
    first = led.write("a", at=T0)[0]
    led.write("b", at=T0 + 40 * H)
    (s,) = led.summarize([first.entry_id], at=T0 + 50 * H)
    assert s.type == "RunSummarized"


def test_a_replay_of_the_log_decides_the_same():
    led = Ledger()
    ids = [led.write(f"n{i}", at=T0 + i * H, command_id=f"w{i}")[0].entry_id for i in range(4)]
    led.summarize(ids[:2], at=T0 + 5 * H)
    led.write("durable", at=T0 + 6 * H, scope="AGENT", command_id="w9")
    # A fresh state folded from the log (as the ledger recovers: from the lean views of the
    # logged bytes) holds the same runs, and decides the next command byte for byte the same.
    replayed = LedgerState()
    for e in led.log:
        evolve(replayed, decode_ledger_view(encode(e)))
    assert replayed.runs == led.state.runs
    nxt = AddMemory(command_id="next", tenant="t", agent="a", issued_at=T0 + 7 * H, summary="n", run="r1")
    assert [encode(e) for e in decide(replayed, nxt)] == [encode(e) for e in decide(led.state, nxt)]
    # ... and a redelivered command decides the same events as the first time.
    assert [encode(e) for e in decide(led.state, nxt)] == [encode(e) for e in decide(led.state, nxt)]


def test_a_snapshot_keeps_the_runs():
    led = Ledger()
    ids = [led.write(f"n{i}", at=T0 + i * H)[0].entry_id for i in range(3)]
    led.summarize(ids[:1], at=T0 + 4 * H)
    state, _, _ = decode_state(encode_state(led.state, OrderedDict()))
    assert state.runs == led.state.runs
    cmd = SummarizeRun(command_id="s9", tenant="t", agent="a", issued_at=T0 + 5 * H, run="r1",
                       entry_ids=ids[1:], summary="S2")
    assert [encode(e) for e in decide(state, cmd)] == [encode(e) for e in decide(led.state, cmd)]


def test_run_events_round_trip_the_contract():
    led = Ledger()
    (e,) = led.write("x")
    assert decode("memlane.memory.events", encode(e)) == e
    (s,) = led.summarize([e.entry_id], at=T0 + H)
    assert decode("memlane.memory.events", encode(s)) == s


def test_a_late_write_does_not_move_the_runs_last_write_back():
    """A write that arrives late (a retried command issued before the run's newest write)
    leaves the run's last write, and so its expiry, where it was."""
    led = Ledger()
    led.write("new", at=T0 + 40 * H)
    (late,) = led.write("late", at=T0 + 10 * H)
    assert late.run_last_write == T0 + 40 * H
    (s,) = led.summarize([late.entry_id], at=T0 + 70 * H)  # 48 h after the late write's own time: still live
    assert s.type == "RunSummarized"
