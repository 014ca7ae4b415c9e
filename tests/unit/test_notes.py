"""Notes (docs/features/notes.md): the pure read-side rules (`events.rules.notes`), the ledger's decide and
fold of `SaveNote`/`ForgetNote` (`events.rules.ledger.notes`), erasure, a recovery from the log,
a snapshot, and sealing. Pure: no broker, no store."""

from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import count

import pytest
from pydantic import ValidationError

from events import AgentConfig, ConfigureAgent, codec
from events.commands import WORKSPACE, EraseSubject, ForgetNote, GrantConsent, RemoveAgent, RemoveUser, SaveNote
from events.lean import decode_ledger_view
from events.record import Provenance, Source
from events.rules import notes as rules
from events.rules.ledger import LedgerState, decide, evolve, forget
from events.rules.ledger.notes import MAX_NOTES, owner_key, revision_of
from workers.processors.ledger.snapshot_file import decode_state, encode_state

NOW = datetime(2026, 12, 2, tzinfo=UTC)
_ids = count()
OPERATOR = Provenance(source=Source.OPERATOR)
SECRET = "CANARY-kestrel-budget"


def nid() -> str:
    return f"n{next(_ids)}"


class Ledger:
    """Drives decide/evolve as the worker does, keeping every event it made."""

    def __init__(self, **memory) -> None:
        self.state, self.log = LedgerState(), []
        self.run(ConfigureAgent(command_id=nid(), tenant="t", agent="a", issued_at=NOW,
                                config=AgentConfig.model_validate({"memory": memory, "history": {}})))

    def run(self, cmd) -> list:
        events = decide(self.state, cmd)
        for e in events:
            evolve(self.state, e)
        self.log += events
        return events

    def save(self, note_id="release-rules", expected=0, user=None, topic="Release rules",
             summary="Releases go out on Tuesdays", sources=(("s1", "m1"),), **kw):
        kw.setdefault("issued_at", NOW)
        return self.run(SaveNote(command_id=nid(), tenant="t", agent=kw.pop("agent", "a"), user=user, note_id=note_id,
                                 topic=topic, summary=summary, expected_revision=expected, session="s1",
                                 sources=[{"conversation": c, "id": m} for c, m in sources], **kw))

    def forget(self, note_id="release-rules", expected=None, user=None, **kw):
        return self.run(ForgetNote(command_id=nid(), tenant="t", agent="a", issued_at=NOW, user=user,
                                   note_id=note_id, expected_revision=expected, **kw))


def only(events, type_):
    assert [e.type for e in events] == [type_], [(e.type, getattr(e, "reason", "")) for e in events]
    return events[0]


# ------------------------------------------------------------------ pure rules


def test_a_message_id_names_a_message_of_the_callers_session_and_an_object_another_session():
    refs = rules.resolve_sources(["m1", {"conversation": "s1", "id": "m2"}, "m1"], "s1", across=False)
    assert list(refs.items()) == [(("s1", "m1"), 0), (("s1", "m2"), 1)]  # once each, in order, first index
    assert list(rules.resolve_sources(["m1", {"conversation": "s9", "id": "m2"}], "s1", across=True)) == [
        ("s1", "m1"), ("s9", "m2")]


def test_another_session_is_refused_naming_its_index_unless_history_reaches_across_conversations():
    with pytest.raises(rules.SourceError) as e:
        rules.resolve_sources(["m1", {"conversation": "s9", "id": "m2"}], "s1", across=False)
    assert e.value.field == "source_messages.1" and "across_conversations" in str(e.value)


def test_a_bare_message_id_needs_a_session():
    with pytest.raises(rules.SourceError) as e:
        rules.resolve_sources(["m1"], None, across=True)
    assert e.value.field == "source_messages.0" and "X-Session" in str(e.value)


def test_a_note_is_shown_only_while_every_source_is_visible_and_reachable():
    refs = [("s1", "m1"), ("s2", "m2")]
    assert rules.shown(refs, "s1", set(refs), across=True)
    assert not rules.shown(refs, "s1", {("s1", "m1")}, across=True)  # m2 deleted or hidden
    assert not rules.shown(refs, "s1", set(refs), across=False)  # another session, no longer reachable
    assert rules.shown([("s1", "m1")], "s1", {("s1", "m1")}, across=False)


@dataclass(frozen=True)
class N:
    id: str
    topic: str
    summary: str
    saved_at: datetime = NOW


def test_rank_counts_shared_words_topic_twice_and_leaves_out_notes_sharing_none():
    notes = [N("a", "Deployment window", "Tuesdays at 14:00"), N("b", "Budget", "The kestrel budget is 4200 euros"),
             N("c", "Lunch", "Pizza on Fridays"), N("d", "Kestrel", "codename for the release")]
    assert [n.id for n in rules.rank(notes, "what is the kestrel budget?")] == ["b", "d"]
    # A topic's word (2) outranks a summary's (1); equal scores and times go by id.
    assert [n.id for n in rules.rank(notes, "deployment of kestrel")] == ["a", "d", "b"]
    assert rules.rank(notes, "the of and") == []  # common words say nothing


def test_rank_ties_go_to_the_newest_note():
    older, newer = N("old", "Kestrel", "x", NOW), N("new", "Kestrel", "y", NOW + timedelta(minutes=1))
    assert [n.id for n in rules.rank([older, newer], "kestrel")] == ["new", "old"]
    assert [n.id for n in rules.newest([older, newer])] == ["new", "old"]


# ------------------------------------------------------------------ commands


@pytest.mark.parametrize("bad", ["", "x" * 129, "a/b", "a b", "a:b", "é"])
def test_a_note_id_is_1_to_128_letters_digits_dot_underscore_dash(bad):
    with pytest.raises(ValidationError) as e:
        SaveNote(command_id="c", tenant="t", agent="a", issued_at=NOW, note_id=bad, topic="t", summary="s",
                 sources=[{"conversation": "s", "id": "m"}], expected_revision=0)
    assert e.value.errors()[0]["loc"] == ("note_id",)


@pytest.mark.parametrize(("field", "value"), [
    ("topic", "x" * 201), ("topic", "   "), ("summary", "x" * 2001), ("summary", ""),
    ("sources", []), ("sources", [{"conversation": "s", "id": f"m{i}"} for i in range(33)]),
    ("expected_revision", -1)])
def test_a_save_is_refused_naming_the_field_over_its_limit(field, value):
    fields = dict(topic="t", summary="s", sources=[{"conversation": "s", "id": "m"}], expected_revision=0)
    fields[field] = value
    with pytest.raises(ValidationError) as e:
        SaveNote(command_id="c", tenant="t", agent="a", issued_at=NOW, note_id="n", **fields)
    assert e.value.errors()[0]["loc"][0] == field


# ------------------------------------------------------------------ the ledger


def test_a_note_is_made_at_revision_1_and_each_save_adds_one():
    led = Ledger()
    made = only(led.save(expected=0), "NoteSaved")
    assert (made.note_id, made.revision, made.user, made.topic) == ("release-rules", 1, None, "Release rules")
    assert [(s.conversation, s.id) for s in made.sources] == [("s1", "m1")]
    assert only(led.save(expected=1, summary="Tuesdays and Thursdays"), "NoteSaved").revision == 2
    assert revision_of(led.state, "t/a", None, "release-rules") == 2


@pytest.mark.parametrize(("expected", "says"), [(0, "already exists at revision 2"), (1, "expected revision 1 but"),
                                                (3, "expected revision 3 but")])
def test_a_stale_or_wrong_revision_is_refused_naming_the_current_one_and_changes_nothing(expected, says):
    led = Ledger()
    led.save(expected=0)
    led.save(expected=1)
    before = copy.deepcopy(dict(led.state.notes))
    e = only(led.save(expected=expected, summary="overwrite"), "CommandRejected")
    assert (e.code, e.field) == ("REVISION_CONFLICT", "expected_revision")
    assert says in e.reason and "2" in e.reason
    assert dict(led.state.notes) == before


def test_revising_a_note_that_does_not_exist_is_a_revision_conflict():
    e = only(Ledger().save(expected=4), "CommandRejected")
    assert e.code == "REVISION_CONFLICT" and "does not exist" in e.reason


def test_forget_removes_the_note_and_the_id_can_be_made_again():
    led = Ledger()
    led.save(expected=0)
    gone = only(led.forget(expected=1), "NoteForgotten")
    assert (gone.note_id, gone.revision) == ("release-rules", 1)
    assert led.state.notes == {}
    assert only(led.forget(), "CommandRejected").code == "NOT_FOUND"
    assert only(led.save(expected=0), "NoteSaved").revision == 1


def test_forget_with_a_stale_revision_is_refused():
    led = Ledger()
    led.save(expected=0)
    led.save(expected=1)
    assert only(led.forget(expected=1), "CommandRejected").code == "REVISION_CONFLICT"
    assert revision_of(led.state, "t/a", None, "release-rules") == 2


def test_notes_of_each_identity_are_apart_under_the_same_id():
    led = Ledger()
    led.save(expected=0)
    assert only(led.save(expected=0, user="u1"), "NoteSaved").revision == 1  # u1's own note of that id
    assert only(led.save(expected=0, user="u2"), "NoteSaved").revision == 1
    assert only(led.save(expected=0, agent="b"), "NoteSaved").revision == 1  # another agent
    assert set(led.state.notes) == {"t/a", owner_key("t/a", "u1"), owner_key("t/a", "u2"), "t/b"}
    assert only(led.forget(user="u3"), "CommandRejected").code == "NOT_FOUND"


def test_only_the_agents_own_tool_calls_write_notes():
    led = Ledger()
    e = only(led.save(provenance=OPERATOR), "CommandRejected")
    assert e.code == "FORBIDDEN" and "agent itself" in e.reason
    assert only(led.save(provenance=Provenance(source=Source.MEMBER)), "CommandRejected").code == "FORBIDDEN"
    assert only(led.save(provenance=Provenance(source=Source.EXTRACTION)), "CommandRejected").code == "FORBIDDEN"
    assert only(led.save(preview=True), "CommandRejected").code == "PREVIEW_READ_ONLY"
    assert led.state.notes == {}


def test_memory_off_consent_and_removal_refuse_a_save():
    assert only(Ledger(enabled=False).save(), "CommandRejected").code == "MEMORY_DISABLED"
    led = Ledger(consent="required")
    assert only(led.save(user="u1"), "CommandRejected").code == "CONSENT_REQUIRED"
    led.run(GrantConsent(command_id=nid(), tenant="t", agent="a", issued_at=NOW, user="u1",
                         provenance=Provenance(source=Source.MEMBER)))
    assert only(led.save(user="u1", issued_at=NOW + timedelta(seconds=1)), "NoteSaved").revision == 1
    led.run(RemoveAgent(command_id=nid(), tenant="t", agent="a", issued_at=NOW, provenance=OPERATOR))
    assert only(led.save(note_id="x", user="u1"), "CommandRejected").code == "SUBJECT_REMOVED"


def test_an_identity_keeps_at_most_max_notes():
    led = Ledger()
    for i in range(MAX_NOTES):
        led.save(note_id=f"n{i}")
    e = only(led.save(note_id="one-more"), "CommandRejected")
    assert (e.code, e.field) == ("LIMIT_EXCEEDED", "note_id")
    assert only(led.save(note_id="n0", expected=1), "NoteSaved").revision == 2  # revising one still works
    assert only(led.save(note_id="mine", user="u1"), "NoteSaved").revision == 1  # a member's count is their own


# ------------------------------------------------------------------ erasure and recovery


def test_a_members_erasure_drops_their_notes_and_an_agents_removal_all_of_them():
    led = Ledger()
    led.save(), led.save(user="u1"), led.save(user="u2")
    led.run(EraseSubject(command_id=nid(), tenant="t", agent="a", issued_at=NOW, user="u1", provenance=OPERATOR))
    assert set(led.state.notes) == {"t/a", owner_key("t/a", "u2")}
    assert only(led.save(user="u1", issued_at=NOW + timedelta(seconds=1)), "NoteSaved").revision == 1  # starts over
    led.run(RemoveAgent(command_id=nid(), tenant="t", agent="a", issued_at=NOW, provenance=OPERATOR))
    assert led.state.notes == {}


def test_a_member_removed_tenant_wide_loses_their_notes_on_every_agent_but_later_ones_stay():
    led = Ledger()
    led.save(user="u1"), led.save(user="u1", agent="b"), led.save(user="u2")
    led.save(note_id="later", user="u1", issued_at=NOW + timedelta(hours=1))
    # As the ledger worker forgets a member erased under the workspace agent on its other partitions.
    forget(led.state, "t/*|u:u1", until=NOW)
    assert {o: set(n) for o, n in led.state.notes.items()} == {
        owner_key("t/a", "u1"): {"later"}, owner_key("t/a", "u2"): {"release-rules"}}
    # On the workspace's own partition the removal's `SubjectErased` holds for every agent.
    led.run(RemoveUser(command_id=nid(), tenant="t", agent=WORKSPACE, issued_at=NOW + timedelta(hours=2), user="u2",
                       provenance=OPERATOR))
    assert set(led.state.notes) == {owner_key("t/a", "u1")}


def test_a_recovery_from_the_log_folds_the_same_notes():
    led = Ledger()
    led.save(), led.save(expected=1), led.save(note_id="other", user="u1"), led.forget(note_id="other", user="u1")
    led.save(note_id="kept", user="u1")
    recovered = LedgerState()
    for e in led.log:
        evolve(recovered, decode_ledger_view(codec.encode(e)))
    assert dict(recovered.notes) == dict(led.state.notes)
    assert dict(recovered.notes)["t/a"]["release-rules"] == (2, NOW)


def test_a_notes_text_is_sealed_under_its_owners_key(keyring, sealing):
    led = Ledger()
    saved = only(led.save(user="u1", summary=SECRET, topic=f"topic {SECRET}"), "NoteSaved")
    data = sealing.encode(saved)
    assert SECRET.encode() not in data
    assert sealing.decode("memlane.memory.events", data) == saved
    cmd = SaveNote(command_id="c", tenant="t", agent="a", issued_at=NOW, user="u1", note_id="n", topic=SECRET,
                   summary=SECRET, sources=[{"conversation": "s", "id": "m"}], expected_revision=0)
    assert SECRET.encode() not in sealing.encode(cmd)
    assert "t/a|u:u1" in keyring.subjects()


def test_a_snapshot_keeps_the_notes_sealed_and_drops_an_erased_members(keyring, sealing):
    led = Ledger()
    led.save(note_id=f"about-{SECRET}", user="u1"), led.save(user="u2"), led.save()
    body = encode_state(led.state, OrderedDict(), c=keyring)
    assert SECRET.encode() not in body
    state, _, dropped = decode_state(body, keyring)
    assert dict(state.notes) == dict(led.state.notes) and dropped == 0
    for rec in keyring.kids("t/a|u:u1"):
        keyring.apply(rec.topic_key, None)  # u1 erased: their key destroyed
    state, _, dropped = decode_state(body, keyring)
    assert set(state.notes) == {"t/a", owner_key("t/a", "u2")} and dropped == 1


def test_a_snapshot_without_a_cipher_keeps_the_notes_as_they_are():
    led = Ledger()
    led.save(), led.save(user="u1")
    state, _, _ = decode_state(encode_state(led.state, OrderedDict()))
    assert dict(state.notes) == dict(led.state.notes)


# ------------------------------------------------------------------ MCP


def _tools(cfg: AgentConfig, role: str = "agent") -> set[str]:
    import asyncio

    from services.client import MemlaneClient
    from services.mcp_server import build_mcp

    return {t.name for t in asyncio.run(build_mcp(MemlaneClient("http://127.0.0.1:9", "k"), cfg, role).list_tools())}


NOTE_TOOLS = {"memory_save", "memory_read", "memory_forget", "memory_search"}


def test_mcp_offers_the_note_tools_with_memory_and_history_and_a_helper_only_the_reads():
    with_history = AgentConfig.model_validate({"history": {}})
    assert NOTE_TOOLS <= _tools(with_history)
    assert _tools(with_history, "helper") & NOTE_TOOLS == {"memory_read", "memory_search"}
    assert not _tools(AgentConfig()) & NOTE_TOOLS  # no history: nothing to cite
    assert not _tools(AgentConfig.model_validate({"history": {}, "memory": {"enabled": False}})) & NOTE_TOOLS


def test_with_memory_off_mcp_offers_no_history_tools_either():
    """Session history is memory too: with memory off a new run gets none of its tools."""
    history_tools = {"search_history", "message_history"}
    assert history_tools <= _tools(AgentConfig.model_validate({"history": {}}))
    assert not _tools(AgentConfig.model_validate({"history": {}, "memory": {"enabled": False}})) & history_tools


@pytest.mark.parametrize("pos", [-1, -10**6, 1.5, float("inf"), "3", True, None, [1]])
def test_an_offset_cursor_is_a_whole_number_from_zero(pos):
    from events.rules.history import decode_offset, encode_cursor

    assert decode_offset(encode_cursor(7, "fp"), "fp") == 7
    # A caller can decode and re-encode a cursor: a negative offset would never move a page on.
    with pytest.raises(ValueError, match="cursor"):
        decode_offset(encode_cursor(pos, "fp"), "fp")
