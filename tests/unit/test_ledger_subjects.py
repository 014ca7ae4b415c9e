"""The ledger's subject rules: user scope, per-subject caps and uniqueness, who may
address a member's record, consent (as of when a write was made), erasure, removals and
`memory.fact_chars`. Pure, but for the last part: the ledger worker's answer to a command id
reused by another caller."""

from __future__ import annotations

from datetime import timedelta

import pytest

from events import (
    AgentConfig,
    ConfigureAgent,
    CurateBlock,
    DeleteMemory,
    EditMemory,
    PinMemory,
    ReportOutcome,
    TurnOutcome,
    UnpinMemory,
)
from events.codec import PLAIN, decode
from events.commands import WORKSPACE, AddMemory, EraseSubject, GrantConsent, RemoveAgent, RemoveUser, WithdrawConsent
from events.record import LIVE, Provenance, Scope, Source, Status
from events.rules.ledger import LIVE_FACT_CAP, LedgerState, caller, decide, evolve, get_record
from events.topics import EVENTS, REDELIVERED
from settings import Settings
from tests.unit.test_ledger_rules import NOW, Ledger, nid, only
from workers.processors.ledger.processor import LedgerProcessor, RecentCommands, caller_of

USER_SCOPES = {"read": ["session", "user", "agent"], "write": ["session", "user", "agent"]}
OPERATOR = Provenance(source=Source.OPERATOR)
MEMBER = Provenance(source=Source.MEMBER)


def common(**kw):
    return dict(command_id=nid(), tenant="t", agent=kw.pop("agent", "a"), issued_at=kw.pop("issued_at", NOW), **kw)


def fact(led, summary, user, **kw):
    """A member's fact, written by the agent in one of the member's sessions."""
    kw.setdefault("scope", "USER")
    return led.add(summary, user=user, **kw)


def added(events):
    return only(events, "RecordAdded").record


def rejected(events, code, field):
    e = only(events, "CommandRejected")
    assert (e.code, e.field) == (code, field), e.reason
    return e


def grant(led, user, **kw):
    kw.setdefault("provenance", Provenance(source=Source.MEMBER, modified_by=f"member:{user}"))
    return led.run(GrantConsent(**common(user=user, **kw)))


def withdraw(led, user, **kw):
    return led.run(WithdrawConsent(**common(user=user, **kw)))


# --------------------------------------------------------------------------- user scope


@pytest.mark.parametrize(
    "write,session,user,scope",
    [
        (["session"], "s1", "u1", "SESSION"),
        (["session", "agent"], "s1", None, "SESSION"),
        (["user"], "s1", "u1", "USER"),
        # A named member wins over the session: a member's fact never lands in session scope,
        # where an operator reads it.
        (["session", "user"], "s1", "u1", "USER"),
        (["session", "user"], None, "u1", "USER"),
        (["session", "user"], "s1", None, "SESSION"),
        (["session", "user", "agent"], "s1", "u1", "USER"),
        (["user", "agent"], "s1", "u1", "USER"),
        (["user", "agent"], "s1", None, "AGENT"),
        (["agent"], "s1", "u1", "AGENT"),
    ],
)
def test_a_write_naming_no_scope_takes_user_then_session_then_agent(write, session, user, scope):
    led = Ledger(scope={"read": write, "write": write})
    r = added(led.add("Prefers tea", session=session, user=user))
    assert r.scope.value == scope
    assert r.user == user  # every scope keeps the member a write named


def test_a_write_naming_no_scope_under_session_only_still_needs_a_session():
    # Today's behaviour for agents configured as before: session scope, refused for want of one.
    rejected(Ledger().add("Prefers tea", session=None, user="u1"), "VALIDATION_FAILED", "session")


@pytest.mark.parametrize("scope", ["USER", None])
def test_user_scope_needs_a_user(scope):
    led = Ledger(scope={"read": ["user"], "write": ["user"]})
    e = rejected(led.add("Prefers tea", scope=scope), "VALIDATION_FAILED", "user")
    assert "user scope requires a user" in e.reason


def test_user_scope_outside_scope_write_is_refused():
    rejected(Ledger().add("Prefers tea", scope="USER", user="u1"), "SCOPE_NOT_ALLOWED", "scope")


# --------------------------------------------------------------------------- per-subject cap and uniqueness


def test_the_live_fact_cap_holds_per_member():
    led = Ledger(scope=USER_SCOPES)
    for i in range(LIVE_FACT_CAP):
        added(fact(led, f"u1 fact number {i}", "u1"))
    e = rejected(fact(led, "one too many", "u1"), "LIMIT_EXCEEDED", "summary")
    assert e.reason.startswith(f"the member holds {LIVE_FACT_CAP} live facts on this agent, the cap is {LIVE_FACT_CAP}")
    # Another member of the same agent, and the agent's own facts, have their own counts.
    assert added(fact(led, "u2's first fact", "u2")).user == "u2"
    assert added(led.add("an agent-wide fact", scope="AGENT")).scope is Scope.AGENT
    assert led.state.stats["t/a|u:u1"]["live"] == LIVE_FACT_CAP
    assert led.state.stats["t/a|u:u2"]["live"] == 1
    assert led.state.stats["t/a"]["live"] == 1
    # Deleting one of u1's facts makes room for one more.
    victim = next(r for r in led.state.subject_records["t/a|u:u1"])
    only(led.run(DeleteMemory(**common(record_id=victim, user="u1", session="s1"))), "RecordDeleted")
    added(fact(led, "now it fits", "u1"))


def test_a_restated_fact_merges_within_a_member_and_not_across_members():
    led = Ledger(scope=USER_SCOPES)
    a = added(fact(led, "Prefers window seats", "u1"))
    b = added(fact(led, "Prefers window seats", "u2"))
    assert a.id != b.id and (a.user, b.user) == ("u1", "u2")
    again = only(fact(led, "prefers WINDOW seats.", "u1", session="s9"), "RecordAdded")
    assert again.merged and again.record.id == a.id


def test_keys_conflict_within_a_member_only():
    led = Ledger(scope=USER_SCOPES)
    added(fact(led, "Plan is gold", "u1", key="plan"))
    assert added(fact(led, "Plan is silver", "u2", key="plan")).status is Status.ACTIVE
    assert added(fact(led, "Plan is bronze", "u1", key="plan", session="s9")).status is Status.CONFLICT


def test_a_session_fact_of_a_member_sees_that_members_keyed_facts():
    led = Ledger(scope=USER_SCOPES)
    added(fact(led, "Timezone is CET", "u1", key="tz", session="s1"))
    # A session fact written in a turn of u1 conflicts with u1's fact, not with u2's.
    assert added(led.add("Timezone is UTC", scope="SESSION", user="u1", key="tz", session="s2")).status \
        is Status.CONFLICT
    assert added(led.add("Timezone is PST", scope="SESSION", user="u2", key="tz", session="s3")).status \
        is Status.ACTIVE
    # A member's fact sees the keyed facts of the session it is written in.
    added(led.add("Locale is fr", scope="SESSION", user="u3", key="locale", session="s4"))
    assert added(fact(led, "Locale is de", "u3", key="locale", session="s4")).status is Status.CONFLICT


def test_the_pinned_budget_holds_per_member():
    led = Ledger(scope=USER_SCOPES, pinned={"max_tokens": 20})  # about 80 characters
    added(fact(led, "u1 pins a line of about forty characters", "u1", pinned=True))
    rejected(fact(led, "u1 pins a second line of forty chars too", "u1", pinned=True), "PIN_BUDGET_EXCEEDED", "pinned")
    assert added(fact(led, "u2 pins a line of about forty characters", "u2", pinned=True)).pinned
    assert added(led.add("the agent pins a line of forty characters", scope="AGENT", pinned=True)).pinned


# --------------------------------------------------------------------------- addressing


def _two_members():
    led = Ledger(scope=USER_SCOPES, pinned={"max_tokens": 2000})
    mine = added(fact(led, "u1 has a cat", "u1", pinned=True))
    theirs = added(fact(led, "u2 has a dog", "u2"))
    return led, mine, theirs


@pytest.mark.parametrize("command", ["delete", "pin", "unpin", "replace", "report"])
@pytest.mark.parametrize("user", ["u2", None])
def test_a_command_never_reaches_another_members_record(command, user):
    led, mine, _ = _two_members()
    kw = common(session="s1", user=user)
    cmd = {
        "delete": DeleteMemory(**kw, record_id=mine.id),
        "pin": PinMemory(**kw, record_id=mine.id),
        "unpin": UnpinMemory(**kw, record_id=mine.id),
        "replace": AddMemory(**kw, summary="u1 has two cats", scope="AGENT", replaces=mine.id),
        "report": ReportOutcome(**kw, record_id=mine.id, success=True),
    }[command]
    e = rejected(led.run(cmd), "NOT_FOUND", "replaces" if command == "replace" else "record_id")
    assert mine.id in e.reason
    assert get_record(led.state, "t/a", mine.id) == mine


def test_a_member_reaches_their_own_record_from_any_session():
    led, mine, _ = _two_members()
    d = only(led.run(DeleteMemory(**common(session="s7", user="u1", record_id=mine.id))), "RecordDeleted")
    assert d.record.status is Status.DELETED


def test_an_operator_never_addresses_a_members_record_and_erases_through_the_subject():
    led, mine, theirs = _two_members()
    for cmd in (EditMemory(**common(record_id=mine.id, summary="u1 has a hamster", provenance=OPERATOR)),
                PinMemory(**common(record_id=theirs.id, provenance=OPERATOR)),
                UnpinMemory(**common(record_id=mine.id, provenance=OPERATOR)),
                DeleteMemory(**common(record_id=mine.id, provenance=OPERATOR)),
                ReportOutcome(**common(record_id=mine.id, success=True, provenance=OPERATOR))):
        e = rejected(led.run(cmd), "NOT_FOUND", "record_id")
        assert e.reason == f"record {cmd.record_id} does not exist for this agent"  # as for a missing record
    assert get_record(led.state, "t/a", mine.id) == mine
    erased = led.run(EraseSubject(**common(user="u1", provenance=OPERATOR)))
    assert [(e.type, getattr(e, "record", None) and e.record.id) for e in erased] == [("RecordDeleted", mine.id),
                                                                                     ("ConsentWithdrawn", None),
                                                                                     ("SubjectErased", None)]


def test_a_member_edits_their_own_fact_as_an_operator_would_and_it_stays_theirs():
    led, mine, _ = _two_members()
    sup, new = led.run(EditMemory(**common(record_id=mine.id, user="u1", summary="u1 has two cats", provenance=MEMBER)))
    assert (sup.type, sup.record.status) == ("RecordSuperseded", Status.SUPERSEDED)
    r = new.record
    assert (r.scope, r.user, r.replaces, r.pinned) == (Scope.USER, "u1", mine.id, True)
    assert r.provenance.source is Source.MEMBER
    assert led.state.subject_records["t/a|u:u1"] == (r.id,)


def test_a_member_deletes_their_fact_even_when_the_agent_no_longer_writes_user_scope():
    led, mine, _ = _two_members()
    led.run(ConfigureAgent(**common(config=AgentConfig.model_validate({"memory": {"pinned": {"max_tokens": 2000}}}))))
    rejected(led.run(DeleteMemory(**common(session="s1", user="u1", record_id=mine.id))), "SCOPE_NOT_ALLOWED",
             "record_id")
    only(led.run(DeleteMemory(**common(user="u1", record_id=mine.id, provenance=MEMBER))), "RecordDeleted")


def test_a_member_reaches_only_their_own_user_records():
    led, mine, theirs = _two_members()
    agent_wide = added(led.add("Office closes at six", scope="AGENT", user="u1"))
    for rid in (theirs.id, agent_wide.id):
        rejected(led.run(DeleteMemory(**common(user="u1", record_id=rid, provenance=MEMBER))), "NOT_FOUND",
                 "record_id")
        rejected(led.run(EditMemory(**common(user="u1", record_id=rid, summary="x", provenance=MEMBER))),
                 "NOT_FOUND", "record_id")


@pytest.mark.parametrize("cls", [AddMemory, PinMemory, RemoveAgent, EraseSubject])
def test_a_member_key_only_edits_deletes_and_grants(cls):
    led, mine, _ = _two_members()
    fields = {AddMemory: {"summary": "a new fact", "scope": "USER"}, PinMemory: {"record_id": mine.id}}.get(cls, {})
    rejected(led.run(cls(**common(user="u1", provenance=MEMBER, **fields))), "FORBIDDEN", None)


@pytest.mark.parametrize("cmd", [
    lambda rid: AddMemory(**common(summary="u1 has a parrot", user="u1", provenance=OPERATOR)),
    lambda rid: AddMemory(**common(summary="u1 has a parrot", scope="USER", provenance=OPERATOR)),
    lambda rid: AddMemory(**common(summary="an office fact", scope="AGENT", user="u1", provenance=OPERATOR)),
    lambda rid: DeleteMemory(**common(record_id=rid, user="u1", provenance=OPERATOR)),
    lambda rid: EditMemory(**common(record_id=rid, summary="x", user="u1", provenance=OPERATOR)),
    lambda rid: PinMemory(**common(record_id=rid, user="u1", provenance=OPERATOR)),
    lambda rid: CurateBlock(**common(label="conventions", action="add", line="Tabs", user="u1", provenance=OPERATOR)),
])
def test_an_operator_never_writes_a_members_memory(cmd):
    led, _, _ = _two_members()
    agent_wide = added(led.add("Office closes at six", scope="AGENT"))
    before = dict(led.state.records)
    e = rejected(led.run(cmd(agent_wide.id)), "FORBIDDEN", "user")
    assert e.reason == "an operator never writes a member's memory"
    assert dict(led.state.records) == before


def test_an_operator_still_writes_agent_memory_and_withdraws_erases_and_removes_members():
    led, mine, _ = _two_members()
    assert added(led.add("Office closes at six", scope="AGENT", session=None, provenance=OPERATOR)).user is None
    rejected(led.run(GrantConsent(**common(user="u1", provenance=OPERATOR))), "FORBIDDEN", "user")
    only(led.run(WithdrawConsent(**common(user="u1", provenance=OPERATOR))), "ConsentWithdrawn")
    assert [e.type for e in led.run(EraseSubject(**common(user="u1", provenance=OPERATOR)))] == [
        "RecordDeleted", "ConsentWithdrawn", "SubjectErased"]
    assert [e.type for e in led.run(RemoveUser(**common(agent=WORKSPACE, user="u1", provenance=OPERATOR)))] == [
        "UserRemoved", "SubjectErased"]
    # A member still edits their own fact (theirs is u2's: u2 edits it).
    r = added(fact(led, "u2 keeps a fish", "u2"))
    _, new = led.run(EditMemory(**common(record_id=r.id, user="u2", summary="u2 keeps two fish", provenance=MEMBER)))
    assert (new.record.scope, new.record.user) == (Scope.USER, "u2")


# --------------------------------------------------------------------------- replacing a member's fact


def test_a_replacement_of_a_members_fact_asking_another_scope_is_refused():
    led, mine, _ = _two_members()
    for scope in ("AGENT", "SESSION"):
        e = rejected(led.add("u1 has two cats", user="u1", scope=scope, replaces=mine.id), "SCOPE_NOT_ALLOWED",
                     "scope")
        assert f"its replacement stays in scope USER, not {scope}" in e.reason
    rejected(led.add("u1 has two cats", user="u1", scope="AGENT", replaces=mine.id, turn_ref="x:1:1"),
             "SCOPE_NOT_ALLOWED", "scope")  # refused before it is staged, too
    assert get_record(led.state, "t/a", mine.id) == mine


def test_a_replacement_of_a_members_fact_stays_theirs_whatever_the_default_scope():
    led, mine, _ = _two_members()
    sup, new = led.add("u1 has two cats", user="u1", replaces=mine.id)
    assert (sup.record.id, new.record.scope, new.record.user) == (mine.id, Scope.USER, "u1")
    # The agent no longer writes user scope: its default would be the session's; the member's
    # fact is not moved there, and the replacement is refused.
    led.run(ConfigureAgent(**common(config=AgentConfig.model_validate({"memory": {
        "pinned": {"max_tokens": 2000}, "scope": {"read": ["session", "agent"], "write": ["session", "agent"]}}}))))
    e = rejected(led.add("u1 has three cats", user="u1", replaces=new.record.id), "SCOPE_NOT_ALLOWED", "scope")
    assert "scope USER is not allowed" in e.reason
    assert get_record(led.state, "t/a", new.record.id).status is Status.ACTIVE


# --------------------------------------------------------------------------- index keys


def test_ids_and_keys_holding_colons_never_share_an_index_slot():
    """Joined bare with ':', member "a" with key "0:fact:x" and member "a:0:fact" with key "x"
    gave one key-index entry: the second member's fact was a CONFLICT with the first's."""
    from events.rules.ledger.subject_rules import dup_scope, key_entry, key_slots_seen

    led = Ledger(scope=USER_SCOPES, kinds=["fact", "k"])
    first = added(fact(led, "a's fact", "a", kind="fact", key="0:fact:x"))
    second = added(fact(led, "another member's fact", "a:0:fact", kind="fact", key="x", session="s2"))
    assert second.status is Status.ACTIVE
    # Sessions alike: session "s:0:k" with key "y", and session "s" with key "0:k:y".
    s1 = added(led.add("in one session", scope="SESSION", session="s:0:k", kind="k", key="y"))
    s2 = added(led.add("in another session", scope="SESSION", session="s", kind="k", key="0:k:y"))
    assert (s1.status, s2.status) == (Status.ACTIVE, Status.ACTIVE)
    entries = {key_entry(seen, r.kind, r.key) for r in (first, s1) for seen in key_slots_seen(r)}
    assert entries.isdisjoint(key_entry(seen, r.kind, r.key) for r in (second, s2) for seen in key_slots_seen(r))
    assert len({dup_scope(r) for r in (first, second, s1, s2)}) == 4


# --------------------------------------------------------------------------- consent


def _consenting(**memory):
    return Ledger(scope=USER_SCOPES, consent="required", **memory)


def test_without_consent_every_write_is_refused_naming_the_user():
    led = _consenting(pinned={"max_tokens": 2000})
    e = rejected(fact(led, "Prefers tea", "u1"), "CONSENT_REQUIRED", "user")
    assert "has not granted consent" in e.reason
    rejected(led.add("an agent fact", scope="AGENT"), "CONSENT_REQUIRED", "user")  # no member named
    rejected(led.curate("conventions", "add", line="Tabs", user="u1"), "CONSENT_REQUIRED", "user")
    grant(led, "u1")
    r = added(fact(led, "Prefers tea", "u1"))
    rejected(fact(led, "u2 prefers coffee", "u2"), "CONSENT_REQUIRED", "user")  # consent is per member
    withdraw(led, "u1")
    e = rejected(fact(led, "Prefers green tea", "u1"), "CONSENT_REQUIRED", "user")
    assert "withdrew consent" in e.reason
    rejected(led.run(PinMemory(**common(session="s1", user="u1", record_id=r.id))), "CONSENT_REQUIRED", "user")
    rejected(led.run(EditMemory(**common(user="u1", record_id=r.id, summary="Prefers mint tea", provenance=MEMBER))),
             "CONSENT_REQUIRED", "user")
    # Withdrawal deletes nothing, and the member still deletes their facts.
    assert get_record(led.state, "t/a", r.id).status is Status.ACTIVE
    only(led.run(DeleteMemory(**common(user="u1", record_id=r.id, provenance=MEMBER))), "RecordDeleted")


def test_consent_not_required_needs_no_grant():
    led = Ledger(scope=USER_SCOPES)
    added(fact(led, "Prefers tea", "u1"))


def test_an_operator_edit_needs_no_members_consent():
    led = _consenting()
    grant(led, "u1")
    r = added(led.add("Office closes at six", scope="AGENT", user="u1"))
    withdraw(led, "u1")
    _, new = led.run(EditMemory(**common(record_id=r.id, summary="Office closes at seven", provenance=OPERATOR)))
    assert new.record.summary == "Office closes at seven" and new.record.user == "u1"


def test_granting_again_answers_again_and_changes_nothing():
    led = _consenting()
    first = only(grant(led, "u1"), "ConsentGranted")
    second = only(grant(led, "u1"), "ConsentGranted")
    assert (first.user, second.user) == ("u1", "u1") and first.event_id != second.event_id
    assert led.state.consent == {"t/a|u:u1": True}
    only(withdraw(led, "u1"), "ConsentWithdrawn")
    only(withdraw(led, "u1"), "ConsentWithdrawn")
    assert led.state.consent == {"t/a|u:u1": False}


@pytest.mark.parametrize("cls", [GrantConsent, WithdrawConsent, EraseSubject])
def test_consent_commands_need_a_user(cls):
    rejected(Ledger().run(cls(**common(provenance=MEMBER if cls is GrantConsent else OPERATOR))), "VALIDATION_FAILED",
             "user")


def test_a_staged_write_without_consent_is_refused_before_it_is_staged():
    led = _consenting()
    rejected(fact(led, "Prefers tea", "u1", turn_ref="x:1:1"), "CONSENT_REQUIRED", "user")
    assert led.state.staged == {}


def test_a_write_staged_before_a_withdrawal_is_refused_when_its_turn_commits():
    led = _consenting()
    grant(led, "u1")
    grant(led, "u2")
    only(fact(led, "Prefers tea", "u1", turn_ref="x:1:1"), "WriteStaged")
    only(fact(led, "Prefers chess", "u2", turn_ref="x:1:1"), "WriteStaged")
    withdraw(led, "u1")
    events = led.run(TurnOutcome(**common(turn_ref="x:1:1", committed=True)))
    assert [e.type for e in events] == ["TurnResolved", "CommandRejected", "RecordAdded"]
    assert (events[1].code, events[1].field) == ("CONSENT_REQUIRED", "user")
    assert events[2].record.user == "u2"
    assert led.state.subject_records.get("t/a|u:u1", ()) == ()


# --------------------------------------------------------------------------- when a write was made


def _at(minutes):
    return NOW + timedelta(minutes=minutes)


def test_a_write_made_before_the_grant_in_force_is_refused_however_late_it_arrives():
    """A lagging review (or a retry from the dead-letter topic) of a turn from a withdrawn
    period is applied after a new grant: consent is asked as of when the write was made."""
    led = _consenting()
    grant(led, "u1", issued_at=_at(0))
    withdraw(led, "u1", issued_at=_at(10))
    grant(led, "u1", issued_at=_at(20))
    review = Provenance(source=Source.EXTRACTION)
    e = rejected(fact(led, "said while withdrawn", "u1", issued_at=_at(15), provenance=review), "CONSENT_REQUIRED",
                 "user")
    assert e.reason.startswith(f"this write was made before the member's consent at {_at(20).isoformat()}")
    rejected(fact(led, "said before the withdrawal", "u1", issued_at=_at(5)), "CONSENT_REQUIRED", "user")
    added(fact(led, "said at the grant", "u1", issued_at=_at(20), provenance=review))
    added(fact(led, "said after it", "u1", issued_at=_at(21)))
    # Another member's grant is their own.
    grant(led, "u2", issued_at=_at(30))
    rejected(fact(led, "u2 before their grant", "u2", issued_at=_at(25)), "CONSENT_REQUIRED", "user")


def test_a_write_staged_in_a_withdrawn_period_is_refused_when_applied_after_a_new_grant():
    led = _consenting()
    grant(led, "u1", issued_at=_at(0))
    only(fact(led, "staged while granted", "u1", turn_ref="x:1:1", issued_at=_at(1)), "WriteStaged")
    withdraw(led, "u1", issued_at=_at(2))
    grant(led, "u1", issued_at=_at(3))
    events = led.run(TurnOutcome(**common(turn_ref="x:1:1", committed=True, issued_at=_at(4))))
    assert [(e.type, getattr(e, "code", None)) for e in events] == [("TurnResolved", None),
                                                                    ("CommandRejected", "CONSENT_REQUIRED")]


def test_consent_not_required_takes_writes_made_before_a_grant():
    led = Ledger(scope=USER_SCOPES)
    grant(led, "u1", issued_at=_at(10))
    added(fact(led, "made before the grant", "u1", issued_at=_at(5)))


@pytest.mark.parametrize("consent", ["required", "not_required"])
def test_a_write_made_before_an_erasure_is_refused_after_it(consent):
    led = Ledger(scope=USER_SCOPES, consent=consent)
    grant(led, "u1", issued_at=_at(0))
    only(fact(led, "staged before the erasure", "u1", turn_ref="x:1:1", issued_at=_at(1)), "WriteStaged")
    led.run(EraseSubject(**common(user="u1", provenance=OPERATOR, issued_at=_at(2))))
    grant(led, "u1", issued_at=_at(3))
    # The staged write went with the member's memory: nothing of it is applied.
    assert led.state.staged == {} and led.state.open_turns == {}
    events = led.run(TurnOutcome(**common(turn_ref="x:1:1", committed=True, issued_at=_at(4))))
    assert [e.type for e in events] == ["TurnResolved"]
    e = rejected(fact(led, "a late review of the erased memory", "u1", issued_at=_at(1)), "SUBJECT_REMOVED", "user")
    assert _at(2).isoformat() in e.reason
    assert led.state.subject_records.get("t/a|u:u1", ()) == ()  # nothing of the erased memory came back
    added(fact(led, "made after the new grant", "u1", issued_at=_at(5)))


# --------------------------------------------------------------------------- deletes after a withdrawal


@pytest.mark.parametrize("source", [Source.EXTRACTION, Source.TOOL])
def test_a_review_or_tool_delete_of_a_subject_without_consent_is_refused(source):
    led = _consenting()
    grant(led, "u1")
    r = added(fact(led, "Prefers tea", "u1"))
    withdraw(led, "u1")
    e = rejected(led.run(DeleteMemory(**common(record_id=r.id, user="u1", session="s1",
                                               provenance=Provenance(source=source)))), "CONSENT_REQUIRED", "user")
    assert "withdrew consent" in e.reason
    assert get_record(led.state, "t/a", r.id).status is Status.ACTIVE  # withdrawal deletes nothing
    only(led.run(DeleteMemory(**common(record_id=r.id, user="u1", provenance=MEMBER))), "RecordDeleted")


def test_a_staged_delete_is_refused_when_its_turn_commits_after_a_withdrawal():
    led = _consenting()
    grant(led, "u1")
    r = added(fact(led, "Prefers tea", "u1"))
    only(led.run(DeleteMemory(**common(record_id=r.id, user="u1", session="s1", turn_ref="x:1:1"))), "WriteStaged")
    withdraw(led, "u1")
    events = led.run(TurnOutcome(**common(turn_ref="x:1:1", committed=True)))
    assert [(e.type, getattr(e, "code", None)) for e in events] == [("TurnResolved", None),
                                                                    ("CommandRejected", "CONSENT_REQUIRED")]
    assert get_record(led.state, "t/a", r.id).status is Status.ACTIVE


def test_an_operator_deletes_agent_records_without_a_members_consent():
    led = _consenting()
    grant(led, "u1")
    r = added(led.add("Office closes at six", scope="AGENT", user="u1"))
    withdraw(led, "u1")
    only(led.run(DeleteMemory(**common(record_id=r.id, provenance=OPERATOR))), "RecordDeleted")


# --------------------------------------------------------------------------- erasure


def test_erasure_tombstones_exactly_the_members_live_facts_and_withdraws_consent():
    led = _consenting()
    for u in ("u1", "u2"):
        grant(led, u)
    kept = [added(fact(led, f"u1 fact {i}", "u1")) for i in range(3)]
    gone = added(fact(led, "u1 fact deleted before", "u1"))
    led.run(DeleteMemory(**common(user="u1", record_id=gone.id, provenance=MEMBER)))
    other = added(fact(led, "u2 fact", "u2"))
    agent_wide = added(led.add("an agent fact written in u1's turn", scope="AGENT", user="u1"))
    events = led.run(EraseSubject(**common(user="u1", provenance=OPERATOR)))
    assert [e.type for e in events] == ["RecordDeleted"] * 3 + ["ConsentWithdrawn", "SubjectErased"]
    assert {e.record.id for e in events[:3]} == {r.id for r in kept}
    assert all(e.record.status is Status.DELETED and e.record.version == 2 for e in events[:3])
    assert events[-2].erased and events[-2].user == "u1"
    assert (events[-1].user, events[-1].tenant_wide) == ("u1", False)
    assert get_record(led.state, "t/a", other.id).status is Status.ACTIVE
    # Then the state forgets every version of the member's records, the deleted one too, and
    # the agent-scope one made in their turn (their data too, though not a fact of theirs).
    assert all(get_record(led.state, "t/a", r.id) is None for r in (*kept, gone, agent_wide))
    assert "t/a|u:u1" not in led.state.subject_records and "t/a|u:u1" not in led.state.stats
    assert led.state.erasures == {"t/a|u:u1": NOW}
    # A later write needs consent again.
    rejected(fact(led, "u1 is back", "u1"), "CONSENT_REQUIRED", "user")
    grant(led, "u1")
    added(fact(led, "u1 is back", "u1"))


def test_erasing_a_member_without_facts_still_answers():
    e, erased = Ledger().run(EraseSubject(**common(user="u9", provenance=OPERATOR)))
    assert e.erased and (erased.type, erased.user) == ("SubjectErased", "u9")


# --------------------------------------------------------------------------- removal


def test_a_removed_agent_takes_no_more_writes():
    led = Ledger(scope=USER_SCOPES)
    r = added(fact(led, "u1 fact", "u1"))
    only(fact(led, "staged before the removal", "u1", turn_ref="x:1:1"), "WriteStaged")
    assert [e.type for e in led.run(RemoveAgent(**common(provenance=OPERATOR)))] == ["AgentRemoved", "SubjectErased"]
    assert led.state.removed_agents == {"t/a": True}
    e = rejected(fact(led, "after the removal", "u1"), "SUBJECT_REMOVED", "agent")
    assert "removed" in e.reason
    rejected(grant(led, "u1"), "SUBJECT_REMOVED", "agent")
    rejected(led.run(ConfigureAgent(**common(config=AgentConfig()))), "SUBJECT_REMOVED", "agent")
    # The staged write and the records went with the agent's memory.
    outcome = led.run(TurnOutcome(**common(turn_ref="x:1:1", committed=True)))
    assert [e.type for e in outcome] == ["TurnResolved"]
    assert get_record(led.state, "t/a", r.id) is None
    # What only deletes still goes through (and finds nothing); another agent is untouched.
    rejected(led.run(DeleteMemory(**common(user="u1", session="s1", record_id=r.id))), "NOT_FOUND", "record_id")
    assert [e.type for e in led.run(RemoveAgent(**common(provenance=OPERATOR)))] == ["AgentRemoved", "SubjectErased"]
    other = added(led.run(AddMemory(**common(agent="b", summary="b's fact", session="s1"))))
    assert other.agent == "b"


def test_a_member_is_removed_under_the_workspace_agent():
    led = Ledger()
    e, erased = led.run(RemoveUser(**common(agent=WORKSPACE, user="u1", provenance=OPERATOR)))
    assert (e.type, e.user, erased.type, erased.user) == ("UserRemoved", "u1", "SubjectErased", "u1")
    assert led.state.erasures == {"t/*|u:u1": NOW}  # on every agent of the tenant
    assert led.state.removed_users == {f"t/{WORKSPACE}|u:u1": True}
    rejected(led.run(RemoveUser(**common(user="u1", provenance=OPERATOR))), "VALIDATION_FAILED", "agent")
    rejected(led.run(RemoveUser(**common(agent=WORKSPACE, provenance=OPERATOR))), "VALIDATION_FAILED", "user")


def test_a_member_removed_from_the_tenant_without_erasure_keeps_their_facts_and_consent():
    led, mine, _ = _two_members()
    only(led.run(GrantConsent(**common(user="u1", provenance=MEMBER))), "ConsentGranted")
    consent = dict(led.state.consent)
    (e,) = led.run(RemoveUser(**common(agent=WORKSPACE, user="u1", provenance=OPERATOR, erase=False)))
    assert (e.type, e.user, e.erased) == ("UserRemoved", "u1", False)
    assert led.state.erasures == {} and led.state.removed_users == {f"t/{WORKSPACE}|u:u1": True}
    assert get_record(led.state, "t/a", mine.id) == mine
    assert led.state.consent == consent and True in consent.values()


def test_a_removed_member_or_tenant_is_restored_only_by_an_operator_and_only_once_removed():
    from events import RemoveTenant, RestoreTenant, RestoreUser

    led = Ledger()
    rejected(led.run(RestoreUser(**common(agent=WORKSPACE, user="u1", provenance=OPERATOR))), "NOT_FOUND", "user")
    rejected(led.run(RestoreTenant(**common(agent=WORKSPACE, provenance=OPERATOR))), "NOT_FOUND", "tenant")
    led.run(RemoveUser(**common(agent=WORKSPACE, user="u1", provenance=OPERATOR)))
    rejected(led.run(RestoreUser(**common(agent=WORKSPACE, user="u1", provenance=MEMBER))), "FORBIDDEN", None)
    rejected(led.run(RestoreUser(**common(user="u1", provenance=OPERATOR))), "VALIDATION_FAILED", "agent")
    [e] = led.run(RestoreUser(**common(agent=WORKSPACE, user="u1", provenance=OPERATOR)))
    assert (e.type, e.user) == ("UserRestored", "u1") and led.state.removed_users == {}
    assert led.state.erasures == {"t/*|u:u1": NOW}  # what was erased stays erased
    led.run(RemoveTenant(**common(agent=WORKSPACE, provenance=OPERATOR)))
    rejected(led.run(RestoreTenant(**common(agent=WORKSPACE))), "FORBIDDEN", None)  # an agent's key
    assert [e.type for e in led.run(RestoreTenant(**common(agent=WORKSPACE, provenance=OPERATOR)))] == [
        "TenantRestored"]


# --------------------------------------------------------------------------- fact_chars


def test_fact_chars_caps_summary_and_content_in_characters():
    led = Ledger(scope=USER_SCOPES, fact_chars=20)
    added(fact(led, "é" * 10, "u1", content="ü" * 10))  # 20 characters, 40 bytes: fits
    e = rejected(fact(led, "a" * 10, "u1", content="b" * 11), "LIMIT_EXCEEDED", "content")
    assert "21 characters" in e.reason and "memory.fact_chars=20" in e.reason
    r = added(fact(led, "short", "u1"))
    rejected(led.run(EditMemory(**common(user="u1", record_id=r.id, content="x" * 30, provenance=MEMBER))),
             "LIMIT_EXCEEDED", "content")
    assert get_record(led.state, "t/a", r.id).status is Status.ACTIVE


@pytest.mark.parametrize("fact_chars", [None, 16_000])
def test_a_members_fact_holds_at_most_4000_characters_whatever_the_agents_setting(fact_chars):
    led = Ledger(scope=USER_SCOPES, **({} if fact_chars is None else {"fact_chars": fact_chars}))
    added(fact(led, "a" * 100, "u1", content="b" * 3900))  # 4,000: fits
    e = rejected(fact(led, "a" * 100, "u1", content="b" * 3901), "LIMIT_EXCEEDED", "content")
    assert "4001 characters" in e.reason and "a member's fact=4000" in e.reason
    added(led.add("a" * 100, scope="AGENT", content="b" * 3901))  # the agent's own memory: its own setting


def test_fact_chars_leaves_episodes_alone():
    led = Ledger(scope=USER_SCOPES, fact_chars=20)
    made = Provenance(source=Source.CONSOLIDATION)
    added(fact(led, "a session retold at length", "u1", kind="episode", provenance=made))


# --------------------------------------------------------------------------- recovery


def test_recovery_folds_the_subject_events_to_the_same_state():
    from events import encode
    from events.lean import decode_ledger_view

    led = _consenting()
    log = list(decide(LedgerState(), ConfigureAgent(**common(config=AgentConfig.model_validate(
        {"memory": {"scope": USER_SCOPES, "consent": "required"}})))))
    log += grant(led, "u1") + grant(led, "u2")
    log += fact(led, "u1 fact", "u1") + fact(led, "u2 fact", "u2")
    log += withdraw(led, "u2")
    log += led.run(EraseSubject(**common(user="u1", provenance=OPERATOR)))
    log += led.run(RemoveAgent(**common(agent="b", provenance=OPERATOR)))
    log += led.run(RemoveUser(**common(agent=WORKSPACE, user="u3", provenance=OPERATOR)))
    full, lean = LedgerState(), LedgerState()
    for e in log:
        evolve(full, e)
        evolve(lean, decode_ledger_view(encode(e)))
    for name in ("records", "stats", "consent", "removed_agents", "removed_users", "subject_records"):
        assert dict(getattr(lean, name)) == dict(getattr(full, name)) == dict(getattr(led.state, name)), name
    assert full.consent == {"t/a|u:u1": False, "t/a|u:u2": False}
    assert full.subject_records == {"t/a|u:u2": (full.subject_records["t/a|u:u2"][0],)}  # u1's were erased
    assert all(get_record(full, "t/a", rid).status in LIVE for rid in full.subject_records["t/a|u:u2"])


def test_a_scratch_state_leaves_the_subject_mappings_of_the_real_one_alone():
    """A turn's outcome decides against a scratch copy; only `evolve` may change the state."""
    from events.rules.ledger import scratch_state

    led = _consenting()
    grant(led, "u1")
    added(fact(led, "u1 fact", "u1"))
    before = {name: dict(getattr(led.state, name)) for name in
              ("consent", "removed_agents", "removed_users", "subject_records", "stats")}
    scratch = scratch_state(led.state)
    scratch.consent["t/a|u:u1"] = False
    scratch.removed_agents["t/a"] = True
    scratch.removed_users["t/@workspace|u:u1"] = True
    scratch.subject_records["t/a|u:u1"] = ()
    scratch.stats["t/a|u:u1"] = {"live": 0, "pinned_chars": 0}
    assert {name: dict(getattr(led.state, name)) for name in before} == before


# --------------------------------------------------------------------------- a reused command id (the ledger worker)


def _worker():
    ledger = LedgerProcessor(Settings(), codec=PLAIN)
    led = Ledger(scope=USER_SCOPES)
    ledger.states[0], ledger.processed[0] = led.state, RecentCommands()
    return ledger


def _events(outs):
    return [decode(EVENTS.name, getattr(o, "value", o)) for o in outs]


ALICE = dict(command_id="idem-1", tenant="t", agent="a", user="alice", session="s-alice",
             provenance=Provenance(source=Source.TOOL, user="alice", session="s-alice"))


@pytest.mark.parametrize("who", [
    {"user": "bob", "session": "s-bob", "provenance": Provenance(source=Source.TOOL, user="bob", session="s-bob")},
    {"user": "bob", "provenance": Provenance(source=Source.TOOL, user="bob", session="s-alice")},  # same session
    {"user": None, "session": None, "provenance": Provenance(source=Source.OPERATOR)},
    {"user": "bob", "session": None, "provenance": Provenance(source=Source.MEMBER, user="bob")},
    {"session": "s-other", "provenance": Provenance(source=Source.TOOL, user="alice", session="s-other")},
])
async def test_a_command_id_reused_by_another_caller_is_refused_not_answered_with_the_first_callers_events(who):
    ledger = _worker()
    first = _events(await ledger.process("memlane.memory.commands", 0, 0, AddMemory(
        **ALICE, issued_at=NOW, summary="Alice's PIN hint is her cat's name", scope="USER")))
    assert [e.type for e in first] == ["RecordAdded"]
    records = dict(ledger.states[0].records)
    # Another caller sends a command under the id alice used (a delete, an add: whatever it is).
    other = DeleteMemory(**{**ALICE, **who}, issued_at=_at(1), record_id="guess")
    outs = await ledger.process("memlane.memory.commands", 0, 1, other)
    [e] = _events(outs)
    assert (e.type, e.code, e.field, e.last) == ("CommandRejected", "DUPLICATE_ID", "command_id", True)
    assert e.reason == "command id idem-1 was already used by another caller; use a new id"
    assert e.event_id != first[0].event_id
    assert "Alice" not in outs[0].value.decode()
    # Written as a copy: never folded, never taken for the id's own events on recovery; and
    # naming its own caller, not alice's.
    assert (REDELIVERED, b"1") in outs[0].headers
    assert caller_of(outs[0].headers) == caller(other) != caller(AddMemory(**ALICE, issued_at=NOW, summary="x"))
    assert dict(ledger.states[0].records) == records
    assert [_events(raws) for raws in ledger.processed[0].events.values()] == [first]  # still alice's alone


async def test_a_retry_rebuilt_with_a_new_time_still_gets_its_events_back():
    ledger = _worker()
    cmd = AddMemory(**ALICE, issued_at=NOW, summary="Alice likes jazz", scope="USER")
    first = await ledger.process("memlane.memory.commands", 0, 0, cmd)
    retry = cmd.model_copy(update={"issued_at": _at(1)})  # an API retry makes the command again
    again = await ledger.process("memlane.memory.commands", 0, 1, retry)
    assert [o.value for o in again] == [o.value for o in first]
    assert {caller_of(o.headers) for o in first + again} == {caller(cmd)}
