"""Tenant and platform memory (docs/features/tenant-platform-memory.md): which facts count toward a
convention and when two are the same (`events.rules.conventions`), and the ledger's rules
(`events.rules.ledger.tenant`): proposals, decisions, floors, platform entries, their limits,
a replay from `LedgerView`s, a snapshot, and a tenant's removal. Pure: no broker, no store."""

from collections import OrderedDict
from datetime import UTC, datetime, timedelta
from itertools import count

import pytest
from pydantic import ValidationError

from events.codec import encode
from events.commands import (
    PLATFORM,
    WORKSPACE,
    DecideConvention,
    ProposeConvention,
    RemovePlatformEntry,
    RemoveTenant,
    RemoveTenantFloor,
    SetPlatformEntry,
    SetTenantFloor,
)
from events.lean import decode_ledger_view
from events.memory import RecordAdded
from events.record import MemoryRecord, Provenance, Scope, Source, Status
from events.rules import conventions
from events.rules.ledger import LedgerState, decide, evolve
from events.rules.ledger.tenant import MAX_FLOORS, MAX_PLATFORM, convention
from events.rules.recall_render import SHARED, Entry, fit
from workers.processors.ledger.snapshot_file import decode_state, encode_state

T0 = datetime(2026, 12, 1, tzinfo=UTC)
OP = Provenance(source=Source.OPERATOR, modified_by="operator:k")
_ids = count()


def cid():
    return f"c{next(_ids)}"


def record(agent="a1", summary="Deploys run on Fridays", **kw):
    fields = dict(id=cid(), version=1, created=T0, modified=T0, tenant="t", agent=agent, scope=Scope.AGENT,
                  kind="fact", summary=summary, status=Status.ACTIVE)
    return MemoryRecord(**(fields | kw))


def run(state, cmd):
    events = decide(state, cmd)
    for e in events:
        evolve(state, e)
    return events


def propose(agents, key="k1", text="Deploys run on Fridays", tenant="t", at=T0):
    return conventions.propose(tenant, key, text, set(agents), at)


def decision(key, what, source=OP, tenant="t"):
    return DecideConvention(command_id=cid(), tenant=tenant, agent=WORKSPACE, issued_at=T0, provenance=source,
                            convention=key, decision=what)


# ------------------------------------------------------------------ which facts, and the same fact


def observe(store: dict, event) -> ProposeConvention | None:
    """The conventions worker's logic over a dict in place of its Redis sets."""
    if event.merged or not conventions.qualifies(event.record, event.agent):
        return None
    key = conventions.fact_key(event.record.summary, event.record.content)
    if key is None:
        return None
    agents = store.setdefault((event.tenant, key), set())
    agents.add(event.agent)
    return conventions.propose(event.tenant, key, event.record.summary, agents, T0) if len(agents) >= 2 else None


def added(r, merged=False):
    return RecordAdded(event_id=cid(), command_id=cid(), tenant=r.tenant, agent=r.agent, occurred_at=T0, record=r,
                       merged=merged)


def test_one_agent_repeating_a_fact_never_makes_a_candidate():
    store: dict = {}
    for _ in range(5):
        assert observe(store, added(record("a1"))) is None
    assert observe(store, added(record("a1", "deploys RUN on friday!"))) is None  # reworded: still one agent
    assert observe(store, added(record("a1"), merged=True)) is None


def test_two_agents_stating_the_same_fact_make_one_candidate():
    store: dict = {}
    assert observe(store, added(record("a1", "The deploy runs on Fridays."))) is None
    cmd = observe(store, added(record("a2", "deploys run on friday")))
    assert cmd is not None and cmd.agents == ["a1", "a2"] and cmd.agent == WORKSPACE and cmd.tenant == "t"
    again = observe(store, added(record("a2", "Deploys run on Fridays")))
    assert again.command_id == cmd.command_id  # the same agents again: the same command, which the ledger answers once


@pytest.mark.parametrize("kw", [
    {"scope": Scope.USER, "user": "u1"},  # a member's fact stays with its agent and its member
    {"scope": Scope.SESSION, "session": "s1"},  # a conversation's
    {"user": "u1"},  # agent scope, but written for a member
    {"preview": True},
    {"status": Status.PENDING},
    {"kind": "episode"},
    {"provenance": Provenance(source=Source.MEMBER)},
])
def test_member_session_and_preview_facts_never_make_a_candidate(kw):
    store: dict = {}
    assert observe(store, added(record("a1"))) is None
    assert observe(store, added(record("a2", **kw))) is None
    assert observe(store, added(record("a3", **kw))) is None


def test_the_same_tenant_only_and_never_the_workspace():
    store: dict = {}
    assert observe(store, added(record("a1"))) is None
    assert observe(store, added(record("a2").model_copy(update={"tenant": "other"}))) is None
    assert not conventions.qualifies(record(WORKSPACE), WORKSPACE)


@pytest.mark.parametrize("a, b, same", [
    ("Deploys run on Fridays", "deploys   RUN on friday.", True),  # case, punctuation, spacing, a word form
    ("The deploy runs on Fridays", "Deploy runs on Fridays", True),  # a stopword
    ("Deploys run on Fridays", "Deploys never run on Fridays", False),  # negation
    ("Port 4471 is open", "Port 4472 is open", False),  # a number
    ("Deploys run on Fridays", "Deploys run on Mondays", False),
    ("Deploys run on Fridays", "Releases go out every Friday", False),  # a paraphrase in other words
])
def test_the_same_fact_is_the_same_content_words(a, b, same):
    assert (conventions.fact_key(a) == conventions.fact_key(b)) is same


def test_a_text_without_content_words_is_no_fact():
    assert conventions.fact_key("the and of") is None


def test_recall_shows_the_five_conventions_sharing_most_words_with_its_text():
    entries = [Entry(f"c{i}", f"rule number {i} about nothing") for i in range(8)] + [
        Entry("db", "the database is postgres in eu-west-1")]
    ranked = conventions.rank(entries, "which database do we use")
    assert len(ranked) == conventions.MAX_CONVENTIONS and ranked[0].id == "db"


# ------------------------------------------------------------------ the ledger: conventions


def test_a_proposal_makes_a_candidate_and_one_naming_no_new_agent_changes_nothing():
    state = LedgerState()
    [e] = run(state, propose(["a1", "a2"]))
    assert e.type == "ConventionProposed" and e.agents == ["a1", "a2"] and e.entry_id == "k1"
    assert convention(state, f"t/{WORKSPACE}", "k1") == ("candidate", frozenset({"a1", "a2"}))
    assert run(state, propose(["a1", "a2"], at=T0 + timedelta(hours=1))) == []
    [e] = run(state, propose(["a2", "a3"]))  # a third agent: the candidate names all three
    assert e.agents == ["a1", "a2", "a3"]


def test_a_single_agent_proposal_is_refused():
    with pytest.raises(ValidationError):
        ProposeConvention(command_id="c", tenant="t", agent=WORKSPACE, issued_at=T0, convention="k", text="x",
                          agents=["a1"])
    cmd = ProposeConvention.model_construct(**{**propose(["a1", "a2"]).__dict__, "agents": ["a1", "a1"]})
    [e] = decide(LedgerState(), cmd)
    assert e.type == "CommandRejected" and e.field == "agents"


def test_approve_and_reject_then_the_same_agents_never_bring_a_rejected_one_back():
    state = LedgerState()
    run(state, propose(["a1", "a2"]))
    [e] = run(state, decision("k1", "approve"))
    assert e.type == "ConventionApproved"
    assert run(state, propose(["a1", "a2", "a3"])) == []  # approved: settled
    [e] = run(state, decision("k1", "reject"))
    assert e.type == "ConventionRejected" and convention(state, f"t/{WORKSPACE}", "k1")[0] == "rejected"
    assert run(state, propose(["a1", "a2"])) == []
    [e] = run(state, propose(["a1", "a4"]))  # another agent establishes it: a candidate again
    assert e.type == "ConventionProposed" and convention(state, f"t/{WORKSPACE}", "k1")[0] == "candidate"


def test_only_an_administrator_decides_and_only_a_known_convention():
    state = LedgerState()
    run(state, propose(["a1", "a2"]))
    [e] = decide(state, decision("k1", "approve", Provenance(source=Source.TOOL)))
    assert e.type == "CommandRejected" and e.code == "FORBIDDEN"
    [e] = decide(state, decision("nope", "approve"))
    assert e.type == "CommandRejected" and e.code == "NOT_FOUND" and e.field == "convention"
    [e] = decide(state, decision("k1", "approve", tenant="other"))  # another tenant's partition knows none
    assert e.code == "NOT_FOUND"


# ------------------------------------------------------------------ the ledger: floors and platform


def floor(fid, text="Never share customer data", tenant="t", agent=WORKSPACE, source=OP):
    return SetTenantFloor(command_id=cid(), tenant=tenant, agent=agent, issued_at=T0, provenance=source,
                          floor=fid, text=text)


def entry(eid, kind="policy", text="Be kind", tenant=PLATFORM, source=OP):
    return SetPlatformEntry(command_id=cid(), tenant=tenant, agent=WORKSPACE, issued_at=T0, provenance=source,
                            entry=eid, kind=kind, text=text)


def test_floors_at_most_twenty_per_tenant_and_set_again_replaces():
    state = LedgerState()
    for i in range(MAX_FLOORS):
        [e] = run(state, floor(f"f{i}"))
        assert e.type == "TenantFloorSet"
    [e] = run(state, floor("one-more"))
    assert e.type == "CommandRejected" and e.code == "LIMIT_EXCEEDED" and e.field == "floor"
    [e] = run(state, floor("f3", "replaced"))
    assert e.type == "TenantFloorSet" and e.text == "replaced"
    [e] = run(state, floor("f3", tenant="t2"))  # another tenant has its own twenty
    assert e.type == "TenantFloorSet"
    [e] = run(state, RemoveTenantFloor(command_id=cid(), tenant="t", agent=WORKSPACE, issued_at=T0, provenance=OP,
                                       floor="f3"))
    assert e.type == "TenantFloorRemoved"
    [e] = run(state, floor("one-more"))
    assert e.type == "TenantFloorSet"
    [e] = run(state, RemoveTenantFloor(command_id=cid(), tenant="t", agent=WORKSPACE, issued_at=T0, provenance=OP,
                                       floor="f3"))
    assert e.code == "NOT_FOUND"


def test_floors_and_policies_are_refused_past_their_recall_budget_so_every_one_is_always_shown():
    state = LedgerState()
    assert run(state, floor("f0", "a" * 480))[0].type == "TenantFloorSet"
    [e] = run(state, floor("f1", "b" * 480))
    assert (e.type, e.code, e.field) == ("CommandRejected", "LIMIT_EXCEEDED", "text") and "800" in e.reason
    assert run(state, floor("f0", "a" * 300))[0].type == "TenantFloorSet"  # the floor replaced is not counted twice
    assert run(state, floor("f1", "b" * 300))[0].type == "TenantFloorSet"
    assert run(state, entry("p0", text="c" * 480))[0].type == "PlatformEntrySet"
    assert run(state, entry("p1", text="d" * 480))[0].code == "LIMIT_EXCEEDED"
    assert run(state, entry("d1", "default", "d" * 480))[0].type == "PlatformEntrySet"  # defaults may be cut
    assert run(state, entry("d2", "default", "d" * 480))[0].type == "PlatformEntrySet"
    # Whatever the ledger took, a recall with every other layer full shows every floor and policy.
    floors = [Entry("f0", "a" * 300), Entry("f1", "b" * 300)]
    full = {h: [Entry(f"{h[:3]}{i}", "w" * 400) for i in range(30)] for h in SHARED}
    f = fit([], [], [(f"b{i}", "y" * 300) for i in range(20)],
            shared=full | {"Tenant floors": floors, "Policy": [Entry("p0", "c" * 480)]})
    assert f.shared["Tenant floors"] == floors and [e.id for e in f.shared["Policy"]] == ["p0"]


@pytest.mark.parametrize("bad, field", [
    ({"text": "x" * 501}, "text"), ({"text": ""}, "text"), ({"floor": "a/b"}, "floor"), ({"floor": "x" * 65}, "floor"),
])
def test_a_floor_is_an_id_and_at_most_500_characters(bad, field):
    fields = dict(command_id="c", tenant="t", agent=WORKSPACE, issued_at=T0, floor="f", text="ok")
    with pytest.raises(ValidationError) as e:
        SetTenantFloor(**(fields | bad))
    assert e.value.errors()[0]["loc"] == (field,)


def test_floors_only_under_the_workspace_by_an_administrator():
    [e] = decide(LedgerState(), floor("f", agent="a1"))
    assert e.code == "VALIDATION_FAILED"
    [e] = decide(LedgerState(), floor("f", source=Provenance(source=Source.TOOL)))
    assert e.code == "FORBIDDEN"
    [e] = decide(LedgerState(), floor("f", tenant=PLATFORM))
    assert e.code == "VALIDATION_FAILED"


def test_platform_entries_at_most_twenty_of_each_kind_only_under_the_platform():
    state = LedgerState()
    for i in range(MAX_PLATFORM):
        assert run(state, entry(f"p{i}"))[0].type == "PlatformEntrySet"
    [e] = run(state, entry("p-more"))
    assert e.code == "LIMIT_EXCEEDED" and e.field == "kind"
    assert run(state, entry("d0", "default"))[0].type == "PlatformEntrySet"  # the other kind has its own
    assert run(state, entry("p0", "policy", "again"))[0].type == "PlatformEntrySet"
    [e] = decide(state, entry("x", tenant="t"))
    assert e.code == "VALIDATION_FAILED" and e.field == "tenant"
    [e] = run(state, RemovePlatformEntry(command_id=cid(), tenant=PLATFORM, agent=WORKSPACE, issued_at=T0,
                                         provenance=OP, entry="p1"))
    assert e.type == "PlatformEntryRemoved"
    assert run(state, entry("p-more"))[0].type == "PlatformEntrySet"


# ------------------------------------------------------------------ replay, snapshot, removal


def _history():
    return [propose(["a1", "a2"]), decision("k1", "reject"), propose(["a3", "a4"], key="k2"),
            decision("k2", "approve"), floor("f1"), floor("f2"),
            RemoveTenantFloor(command_id="rm", tenant="t", agent=WORKSPACE, issued_at=T0, provenance=OP, floor="f2"),
            entry("p1"), entry("d1", "default")]


def test_a_replay_from_ledger_views_and_a_snapshot_give_the_same_state():
    state, logged = LedgerState(), []
    for cmd in _history():
        logged += run(state, cmd)
    replayed = LedgerState()
    for e in logged:
        evolve(replayed, decode_ledger_view(encode(e)))
    assert dict(replayed.shared) == dict(state.shared)
    again, _, _ = decode_state(encode_state(state, OrderedDict()))
    assert dict(again.shared) == dict(state.shared)
    assert run(again, propose(["a1", "a2"])) == []  # still rejected for those agents after a recovery


def test_removing_the_tenant_forgets_its_conventions_and_floors_and_nothing_of_the_platform():
    state = LedgerState()
    for cmd in _history():
        run(state, cmd)
    run(state, RemoveTenant(command_id="rt", tenant="t", agent=WORKSPACE, issued_at=T0, provenance=OP))
    assert f"t/{WORKSPACE}" not in state.shared and f"{PLATFORM}/{WORKSPACE}" in state.shared


def test_a_tenants_texts_are_sealed_under_its_workspace_key_and_the_platforms_are_not(tmp_path):
    from events.codec import Codec
    from events.sealing import subject_of
    from projections.keys import Keyring, LocalKeyFile

    ring = Keyring(LocalKeyFile.create(tmp_path / "memlane.key"))
    sealing = Codec(ring)
    canary = "canary-9d1e wombat"
    state = LedgerState()
    [floor_set] = decide(state, floor("f1", canary))
    [proposed] = decide(state, propose(["a1", "a2"], text=canary))
    [entry_set] = decide(state, entry("p1", text=canary))
    for e in (floor_set, proposed):
        data = sealing.encode(e)
        assert canary.encode() not in data
        assert sealing.decode("memlane.memory.events", data).text == canary
        assert decode_ledger_view(data, sealing).entry_id == e.entry_id  # recovery reads the id without the key
    assert canary.encode() in sealing.encode(entry_set)
    assert canary.encode() not in sealing.encode(propose(["a1", "a2"], text=canary))
    # Under the tenant's workspace key, which removing the tenant destroys (and no agent's).
    assert {bytes(rec.topic_key).decode().split("#")[0] for rec in ring.pending} == {subject_of("t", WORKSPACE)}


def test_a_fact_in_more_agents_than_a_proposal_names_still_makes_one_valid_proposal():
    at = datetime(2026, 1, 1, tzinfo=UTC)
    many = {f"agent{i:05d}" for i in range(conventions.MAX_NAMED + 50)}
    cmd = conventions.propose("t", "k", "Deploys go out on Tuesdays", many, at)
    assert len(cmd.agents) == conventions.MAX_NAMED and cmd.agents == sorted(many)[:conventions.MAX_NAMED]
    # However many more agents come, it is the same command: the ledger answers it as seen.
    assert conventions.propose("t", "k", "x", many | {"zzz"}, at).command_id == cmd.command_id
