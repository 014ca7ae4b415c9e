"""The ledger's subject rules (seed 004): user scope, per-subject caps and uniqueness, who may
address a member's record, consent, erasure, removals and `memory.fact_chars`. Pure."""

from __future__ import annotations

import pytest

from events import (
    AgentConfig,
    ConfigureAgent,
    DeleteMemory,
    EditMemory,
    PinMemory,
    ReportOutcome,
    TurnOutcome,
    UnpinMemory,
)
from events.commands import WORKSPACE, AddMemory, EraseSubject, GrantConsent, RemoveAgent, RemoveUser, WithdrawConsent
from events.record import LIVE, Provenance, Scope, Source, Status
from events.rules.ledger import LIVE_FACT_CAP, LedgerState, decide, evolve, get_record
from tests.unit.test_ledger_rules import NOW, Ledger, nid, only

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
        (["session", "user"], "s1", "u1", "SESSION"),
        (["session", "user"], None, "u1", "USER"),
        (["user", "agent"], "s1", "u1", "USER"),
        (["user", "agent"], "s1", None, "AGENT"),
        (["agent"], "s1", "u1", "AGENT"),
    ],
)
def test_a_write_naming_no_scope_takes_session_then_user_then_agent(write, session, user, scope):
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


def test_an_operator_deletes_a_members_record_and_nothing_more():
    led, mine, theirs = _two_members()
    rejected(led.run(EditMemory(**common(record_id=mine.id, summary="u1 has a hamster", provenance=OPERATOR))),
             "NOT_FOUND", "record_id")
    rejected(led.run(PinMemory(**common(record_id=theirs.id, provenance=OPERATOR))), "NOT_FOUND", "record_id")
    d = only(led.run(DeleteMemory(**common(record_id=mine.id, provenance=OPERATOR))), "RecordDeleted")
    assert d.record.status is Status.DELETED and d.record.provenance.source is Source.OPERATOR


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
    rejected(Ledger().run(cls(**common())), "VALIDATION_FAILED", "user")


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
    assert [e.type for e in events] == ["RecordDeleted"] * 3 + ["ConsentWithdrawn"]
    assert {e.record.id for e in events[:3]} == {r.id for r in kept}
    assert all(e.record.status is Status.DELETED and e.record.version == 2 for e in events[:3])
    assert events[-1].erased and events[-1].user == "u1"
    assert get_record(led.state, "t/a", other.id).status is Status.ACTIVE
    assert get_record(led.state, "t/a", agent_wide.id).status is Status.ACTIVE
    assert get_record(led.state, "t/a", gone.id).version == 2  # not tombstoned twice
    assert led.state.subject_records["t/a|u:u1"] == ()
    assert led.state.stats["t/a|u:u1"]["live"] == 0
    # A later write needs consent again.
    rejected(fact(led, "u1 is back", "u1"), "CONSENT_REQUIRED", "user")
    grant(led, "u1")
    added(fact(led, "u1 is back", "u1"))


def test_erasing_a_member_without_facts_still_answers():
    e = only(Ledger().run(EraseSubject(**common(user="u9", provenance=OPERATOR))), "ConsentWithdrawn")
    assert e.erased


# --------------------------------------------------------------------------- removal


def test_a_removed_agent_takes_no_more_writes():
    led = Ledger(scope=USER_SCOPES)
    r = added(fact(led, "u1 fact", "u1"))
    only(fact(led, "staged before the removal", "u1", turn_ref="x:1:1"), "WriteStaged")
    only(led.run(RemoveAgent(**common(provenance=OPERATOR))), "AgentRemoved")
    assert led.state.removed_agents == {"t/a": True}
    e = rejected(fact(led, "after the removal", "u1"), "SUBJECT_REMOVED", "agent")
    assert "removed" in e.reason
    rejected(grant(led, "u1"), "SUBJECT_REMOVED", "agent")
    rejected(led.run(ConfigureAgent(**common(config=AgentConfig()))), "SUBJECT_REMOVED", "agent")
    outcome = led.run(TurnOutcome(**common(turn_ref="x:1:1", committed=True)))
    assert [(e.type, getattr(e, "code", None)) for e in outcome] == [("TurnResolved", None),
                                                                     ("CommandRejected", "SUBJECT_REMOVED")]
    # What only deletes still goes through; another agent is untouched.
    only(led.run(DeleteMemory(**common(user="u1", session="s1", record_id=r.id))), "RecordDeleted")
    only(led.run(RemoveAgent(**common(provenance=OPERATOR))), "AgentRemoved")
    other = added(led.run(AddMemory(**common(agent="b", summary="b's fact", session="s1"))))
    assert other.agent == "b"


def test_a_member_is_removed_under_the_workspace_agent():
    led = Ledger()
    e = only(led.run(RemoveUser(**common(agent=WORKSPACE, user="u1", provenance=OPERATOR))), "UserRemoved")
    assert e.user == "u1"
    assert led.state.removed_users == {f"t/{WORKSPACE}|u:u1": True}
    rejected(led.run(RemoveUser(**common(user="u1", provenance=OPERATOR))), "VALIDATION_FAILED", "agent")
    rejected(led.run(RemoveUser(**common(agent=WORKSPACE, provenance=OPERATOR))), "VALIDATION_FAILED", "user")


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
    assert full.subject_records == {"t/a|u:u1": (), "t/a|u:u2": (full.subject_records["t/a|u:u2"][0],)}
    assert all(get_record(full, "t/a", rid).status in LIVE for rid in full.subject_records["t/a|u:u2"])


def test_a_scratch_state_leaves_the_subject_mappings_of_the_real_one_alone():
    """A turn's outcome decides against a scratch copy; only `evolve` may change the state."""
    from events.rules.ledger import _scratch

    led = _consenting()
    grant(led, "u1")
    added(fact(led, "u1 fact", "u1"))
    before = {name: dict(getattr(led.state, name)) for name in
              ("consent", "removed_agents", "removed_users", "subject_records", "stats")}
    scratch = _scratch(led.state)
    scratch.consent["t/a|u:u1"] = False
    scratch.removed_agents["t/a"] = True
    scratch.removed_users["t/@workspace|u:u1"] = True
    scratch.subject_records["t/a|u:u1"] = ()
    scratch.stats["t/a|u:u1"] = {"live": 0, "pinned_chars": 0}
    assert {name: dict(getattr(led.state, name)) for name in before} == before
