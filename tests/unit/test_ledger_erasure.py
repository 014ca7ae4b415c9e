"""Erasure in the ledger: every erasure and removal ends with `SubjectErased`, whose
fold leaves the state a fold of the log without what was sealed under the erased subject's keys
(what a recovery reads once they are destroyed); only markers stay. A snapshot holds no
plaintext, and an entry sealed under a destroyed key is dropped when it is read. (The ledger
worker's part, and `DELETE /v1/tenant`: tests/resilience/test_erasure_ledger.py.)"""

from __future__ import annotations

import copy
import json
from collections import OrderedDict
from datetime import timedelta

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events import codec
from events.codec import Codec, encode
from events.commands import (
    WORKSPACE,
    AddMemory,
    ConfigureAgent,
    CurateBlock,
    DeleteMemory,
    EraseSubject,
    GrantConsent,
    RemoveAgent,
    RemoveTenant,
    RemoveUser,
    TurnOutcome,
)
from events.config import AgentConfig
from events.errors import ErrorCode
from events.lean import decode_ledger_view
from events.memory import RecordAdded
from events.record import Provenance, Source
from events.rules.ledger import LedgerState, covers, decide, erasure_key, evolve, forget, get_record
from events.sealing import seal_fields
from tests.unit.test_ledger_rules import NOW, Ledger, nid
from workers.processors.ledger.snapshot_file import decode_state, encode_state

OPERATOR = Provenance(source=Source.OPERATOR)
MEMBER = Provenance(source=Source.MEMBER)
SCOPES = {"read": ["session", "user", "agent"], "write": ["session", "user", "agent"]}
MEMORY = {"scope": SCOPES, "pinned": {"max_tokens": 2000}}
FIELDS = ("records", "index", "staged", "open_turns", "turns", "turns_before", "configs", "blocks", "stats", "consent",
          "granted_at", "erased_at", "removed_agents", "removed_users", "subject_records", "erasures")


def common(**kw):
    return dict(command_id=nid(), tenant=kw.pop("tenant", "t"), agent=kw.pop("agent", "a"),
                issued_at=kw.pop("issued_at", NOW), **kw)


def configured(*agents: str, tenant: str = "t") -> Ledger:
    led = Ledger()
    for agent in agents:
        led.run(ConfigureAgent(**common(tenant=tenant, agent=agent, config=AgentConfig.model_validate({"memory": MEMORY}))))
    return led


def fact(led: Ledger, summary: str, user: str | None = None, **kw) -> list:
    kw.setdefault("session", "s1")
    kw.setdefault("scope", "USER" if user else "SESSION")
    return led.run(AddMemory(**common(summary=summary, user=user, **kw)))


def same(a: LedgerState, b: LedgerState, how: str = "") -> None:
    for name in FIELDS:
        assert dict(getattr(a, name)) == dict(getattr(b, name)), f"{how}: {name}"
    assert a.turns_since == b.turns_since


# --------------------------------------------------------------------------- decide


def test_each_erasure_and_removal_ends_with_subject_erased():
    led = configured("a")
    kinds = lambda events: [(e.type, getattr(e, "user", None), getattr(e, "tenant_wide", None)) for e in events]  # noqa: E731
    assert kinds(led.run(EraseSubject(**common(user="u1", provenance=OPERATOR))))[-1] == ("SubjectErased", "u1", False)
    assert kinds(led.run(RemoveAgent(**common(provenance=OPERATOR)))) == [
        ("AgentRemoved", None, None), ("SubjectErased", None, False)]
    assert kinds(led.run(RemoveUser(**common(agent=WORKSPACE, user="u2", provenance=OPERATOR)))) == [
        ("UserRemoved", "u2", None), ("SubjectErased", "u2", False)]
    assert kinds(led.run(RemoveTenant(**common(agent=WORKSPACE, provenance=OPERATOR)))) == [
        ("SubjectErased", None, True)]
    assert led.state.erasures == {"t/a|u:u1": NOW, "t/a": NOW, "t/*|u:u2": NOW, "t/*": NOW}


def test_only_an_operator_removes_a_tenant_and_under_the_workspace():
    led = configured("a")
    for cmd, code, field in (
        (RemoveTenant(**common(provenance=OPERATOR)), ErrorCode.VALIDATION_FAILED, "agent"),
        (RemoveTenant(**common(agent=WORKSPACE)), ErrorCode.FORBIDDEN, None),  # an agent's key
        (RemoveTenant(**common(agent=WORKSPACE, user="u1", provenance=MEMBER)), ErrorCode.FORBIDDEN, None),
    ):
        [e] = led.run(cmd)
        assert (e.type, e.code, e.field) == ("CommandRejected", code, field), e.reason
    assert led.state.erasures == {}


def test_the_erasure_keys_name_what_each_erasure_takes():
    assert erasure_key("t", "a", "u1") == "t/a|u:u1" and erasure_key("t", "a", None) == "t/a"
    assert erasure_key("t", WORKSPACE, "u1") == "t/*|u:u1" and erasure_key("t", WORKSPACE, None, True) == "t/*"
    assert erasure_key("t", WORKSPACE, None) == f"t/{WORKSPACE}"  # the workspace's own blocks only
    takes = {
        "t/a|u:u1": {"t/a|u:u1"},
        "t/a": {"t/a", "t/a|u:u1", "t/a|u:u11"},
        "t/*|u:u1": {"t/a|u:u1", "t/ab|u:u1"},
        "t/*": {"t/a", "t/a|u:u1", "t/a|u:u11", "t/ab", "t/ab|u:u1", f"t/{WORKSPACE}"},
    }
    every = set().union(*takes.values()) | {"t2/a", "t2/a|u:u1"}
    for key, taken in takes.items():
        assert {s for s in every if covers(key, s)} == taken, key


# --------------------------------------------------------------------------- the fold


def test_erasing_a_member_forgets_every_version_of_their_facts_and_nothing_else():
    led = configured("a")
    mine = [fact(led, f"u1 fact {i}", "u1", key=f"k{i}", pinned=i == 0)[-1].record for i in range(3)]
    led.run(DeleteMemory(**common(user="u1", record_id=mine[2].id, provenance=MEMBER)))  # a tombstone first
    theirs = fact(led, "u2 fact", "u2", key="k0")[-1].record
    shared = fact(led, "an agent fact said in u1's turn", "u1", scope="AGENT", session=None)[-1].record
    fact(led, "u1 staged", "u1", turn_ref="x:1:1")
    fact(led, "u2 staged", "u2", turn_ref="x:1:1", issued_at=NOW + timedelta(seconds=5))
    led.curate("style", "add", line="Tabs", user="u1", provenance=Provenance(user="u1"))
    assert led.state.open_turns["t/a"]["t/a|x:1:1"] == NOW
    led.run(EraseSubject(**common(user="u1", provenance=OPERATOR, issued_at=NOW + timedelta(seconds=9))))
    s = led.state
    # An agent-scope fact made from u1's turn is u1's data too: it goes with them.
    assert all(get_record(s, "t/a", r.id) is None for r in [*mine, shared])
    assert get_record(s, "t/a", theirs.id) is not None
    assert set(s.index.values()) == {theirs.id}
    assert "t/a|u:u1" not in s.stats and "t/a|u:u1" not in s.subject_records
    assert s.stats["t/a|u:u2"] == {"live": 1, "pinned_chars": 0} and "t/a" not in s.stats
    assert [json.loads(w)["summary"] for w in s.staged["t/a|x:1:1"]] == ["u2 staged"]
    assert s.open_turns["t/a"]["t/a|x:1:1"] == NOW + timedelta(seconds=5)  # open since the write left
    assert s.blocks == {"t/a": {"style": "Tabs"}}  # the agent's, whoever's turn wrote it
    assert s.consent == {"t/a|u:u1": False} and s.erasures == {"t/a|u:u1": NOW + timedelta(seconds=9)}


def test_a_removed_agent_keeps_only_markers_and_other_agents_keep_theirs():
    led = configured("a", "b")
    fact(led, "u1 fact", "u1")
    fact(led, "a session fact", key="k")
    fact(led, "staged", "u1", turn_ref="x:1:1")
    led.curate("style", "add", line="Tabs")
    led.run(GrantConsent(**common(user="u1", provenance=MEMBER)))
    kept = fact(led, "b's fact", "u1", agent="b")[-1].record
    led.run(AddMemory(**common(agent="b", summary="b's session fact", session="s1", key="k")))
    b_index = {k: v for k, v in led.state.index.items() if k.startswith("t/b|")}
    led.run(RemoveAgent(**common(provenance=OPERATOR)))
    s = led.state
    assert not [k for k in s.records if k.startswith("t/a/")] and get_record(s, "t/b", kept.id)
    assert s.index == b_index and len(b_index) == 3
    assert set(s.stats) == {"t/b", "t/b|u:u1"} and set(s.subject_records) == {"t/b|u:u1"}
    assert s.staged == {} and s.open_turns == {} and s.blocks == {}
    assert set(s.configs) == {"t/a", "t/b"} and s.consent == {"t/a|u:u1": True}
    assert s.removed_agents == {"t/a": True} and s.erasures == {"t/a": NOW}


def test_a_member_or_the_tenant_erased_under_the_workspace_is_forgotten_on_every_agent_held():
    led = configured("a", "b")
    led.run(ConfigureAgent(**common(tenant="t2", config=AgentConfig.model_validate({"memory": MEMORY}))))
    ids = {(agent, user): fact(led, f"{user} on {agent}", user, agent=agent)[-1].record.id
           for agent in ("a", "b") for user in ("u1", "u2")}
    other = fact(led, "another tenant's u1", "u1", tenant="t2")[-1].record.id
    led.run(CurateBlock(**common(agent=WORKSPACE, label="conventions", action="add", line="Be brief")))
    led.run(RemoveUser(**common(agent=WORKSPACE, user="u1", provenance=OPERATOR)))
    left = {rid for agent in ("a", "b") for rid in ids.values() if get_record(led.state, f"t/{agent}", rid)}
    assert left == {ids["a", "u2"], ids["b", "u2"]} and get_record(led.state, "t2/a", other)
    assert led.state.blocks == {f"t/{WORKSPACE}": {"conventions": "Be brief"}}
    led.run(RemoveTenant(**common(agent=WORKSPACE, provenance=OPERATOR)))
    assert [k.split("/")[0] for k in led.state.records] == ["t2"] and led.state.blocks == {}
    assert set(led.state.stats) == {"t2/a|u:u1"} and all(k.startswith("t2/") for k in led.state.index)


def test_forgetting_until_a_time_keeps_what_came_later():
    """A member removed on another partition comes back, under new keys: what the ledger worker
    forgets of the partitions it holds is what was written up to the erasure."""
    led = configured("a")
    old = fact(led, "before", "u1")[-1].record.id
    new = fact(led, "after", "u1", issued_at=NOW + timedelta(hours=1))[-1].record.id
    assert forget(led.state, "t/*|u:u1", until=NOW + timedelta(minutes=1)) == 1
    assert get_record(led.state, "t/a", old) is None and get_record(led.state, "t/a", new)
    assert led.state.subject_records == {"t/a|u:u1": (new,)} and led.state.stats["t/a|u:u1"]["live"] == 1


def test_the_index_holds_no_record_key():
    led = configured("a")
    fact(led, "a keyed fact", "u1", key="CANARY-key")
    assert led.state.index and not any("CANARY" in k for k in led.state.index)
    [e] = fact(led, "another text, the same key", "u1", key="CANARY-key")
    assert e.record.status.value == "CONFLICT"  # still unique per key


# --------------------------------------------------------------------------- the fold = the log without the subject


class _Recorder:
    """A cipher that notes whose key each seal would use, as `events.codec.encode` seals."""

    def __init__(self) -> None:
        self.subjects: set[str] = set()

    def seal(self, subject: str, aad: bytes, plaintext: bytes) -> str:
        self.subjects.add(subject)
        return "sealed"


def sealed_under(event) -> set[str]:
    """The subjects whose keys an event's sealed fields need: its own, and a staged write's."""
    rec = _Recorder()
    message = json.loads(encode(event))
    staged = message.get("command") if message["type"] == "WriteStaged" else None
    seal_fields(message, rec)
    if staged:
        seal_fields(json.loads(staged), rec)
    return rec.subjects


def without_erased(log: list) -> list:
    """The log as a recovery reads it once each erasure's keys are destroyed: every event sealed
    under a key an erasure after it takes is gone."""
    erasures = [(i, erasure_key(e.tenant, e.agent, e.user, e.tenant_wide)) for i, e in enumerate(log)
                if e.type == "SubjectErased"]
    return [e for i, e in enumerate(log)
            if not any(j > i and covers(key, s) for j, key in erasures for s in sealed_under(e))]


AGENTS = ("a", "b")
USERS = ("u1", "u2", "u3")
TURNS = ("x:1:1", "x:2:1")
agent = st.sampled_from(AGENTS)
user = st.sampled_from(USERS)
OPS = {
    "add": st.tuples(st.just("add"), agent, st.sampled_from((*USERS, None)),
                     st.sampled_from((None, "USER", "USER", "AGENT", "SESSION")), st.integers(0, 4),
                     st.sampled_from((None, "k")), st.sampled_from((None, None, *TURNS)), st.booleans(), st.booleans()),
    "delete": st.tuples(st.just("delete"), agent, st.integers(0, 40), st.sampled_from(("agent", "member", "operator")),
                        user),
    "outcome": st.tuples(st.just("outcome"), agent, st.sampled_from(TURNS), st.booleans()),
    "curate": st.tuples(st.just("curate"), st.sampled_from((*AGENTS, WORKSPACE)), st.integers(0, 3),
                        st.sampled_from((*USERS, None)), st.sampled_from((None, *TURNS))),
    "erase": st.tuples(st.just("erase"), agent, user),
    "remove_agent": st.tuples(st.just("remove_agent"), agent),
    "remove_user": st.tuples(st.just("remove_user"), user),
    "remove_tenant": st.tuples(st.just("remove_tenant")),
}
WEIGHTS = ("add",) * 12 + ("delete",) * 2 + ("outcome",) * 3 + ("curate",) * 2 + ("erase",) * 3 + (
    "remove_agent", "remove_user", "remove_user", "remove_tenant")
ops = st.sampled_from(WEIGHTS).flatmap(OPS.__getitem__)


def _command(op, n: int, ids: list[tuple[str, str]]):
    base = dict(command_id=f"p{n}", tenant="t", agent=op[1] if len(op) > 1 and op[1] in (*AGENTS, WORKSPACE) else "a",
                issued_at=NOW + timedelta(seconds=n))
    kind = op[0]
    if kind == "add":
        _, _, u, scope, text, key, turn, pinned, spoken = op
        return AddMemory(**base, user=u, scope=scope, session="s1", summary=f"fact {text} of {u}", key=key,
                         turn_ref=turn, pinned=pinned, provenance=Provenance(user=u if spoken else None))
    if kind == "delete":
        _, a, pick, who, u = op
        owned = [rid for ag, rid in ids if ag == a]
        rid = owned[pick % len(owned)] if owned else "no-such-record"
        if who == "operator":
            return DeleteMemory(**base, record_id=rid, provenance=OPERATOR)
        if who == "member":
            return DeleteMemory(**base, record_id=rid, user=u, provenance=Provenance(source=Source.MEMBER, user=u))
        return DeleteMemory(**base, record_id=rid, user=u, session="s1")
    if kind == "outcome":
        return TurnOutcome(**base, turn_ref=op[2], committed=op[3])
    if kind == "curate":
        _, _, line, u, turn = op
        return CurateBlock(**base, label="notes", action="add", line=f"line {line}", user=u, turn_ref=turn,
                           provenance=Provenance(user=u))
    if kind == "erase":
        return EraseSubject(**base, user=op[2], provenance=OPERATOR)
    if kind == "remove_agent":
        return RemoveAgent(**base, provenance=OPERATOR)
    if kind == "remove_user":
        return RemoveUser(**{**base, "agent": WORKSPACE}, user=op[1], provenance=OPERATOR)
    return RemoveTenant(**{**base, "agent": WORKSPACE}, provenance=OPERATOR)


@settings(max_examples=300, deadline=None)
@given(st.lists(ops, min_size=5, max_size=60))
def test_the_state_after_erasures_is_the_fold_of_the_log_without_the_erased_subjects(script):
    live, log, ids = LedgerState(), [], []
    for agent_ in (*AGENTS, WORKSPACE):
        cfg = ConfigureAgent(command_id=f"cfg-{agent_}", tenant="t", agent=agent_, issued_at=NOW,
                             config=AgentConfig.model_validate({"memory": MEMORY}))
        log += [*(e for e in decide(live, cfg))]
        for e in log[-1:]:
            evolve(live, e)
    for n, op in enumerate(script, start=1):
        for e in decide(live, _command(op, n, ids)):
            evolve(live, e)
            log.append(e)
            if isinstance(e, RecordAdded) and not e.merged:
                ids.append((e.agent, e.record.id))
    expected, recovered = LedgerState(), LedgerState()
    for e in without_erased(log):
        evolve(expected, e)
        evolve(recovered, decode_ledger_view(encode(e)))
    same(live, expected, "the fold of the log without them")
    same(live, recovered, "as a recovery folds it")


# --------------------------------------------------------------------------- snapshots


def _scenario(sealing: Codec) -> tuple[Ledger, OrderedDict]:
    led = configured("a")
    recent: OrderedDict[str, list[bytes]] = OrderedDict()
    runs = [
        fact(led, "CANARY-u1 likes tea", "u1", key="CANARY-key", content="CANARY-content", pinned=True),
        fact(led, "CANARY-u1 staged", "u1", turn_ref="x:1:1"),
        fact(led, "u2 likes coffee", "u2", key="k2", turn_ref="x:2:1"),
        fact(led, "CANARY-agent fact", scope="AGENT", session=None),
        fact(led, "CANARY-u1 said in agent scope", "u1", scope="AGENT", session=None),  # u1's, as made in u1's turn
        led.curate("style", "add", line="CANARY-block"),
    ]
    for i, events in enumerate(runs):
        recent[f"c{i}"] = [sealing.encode(e) for e in events]
    return led, recent


def test_a_snapshot_holds_no_plaintext_and_opens_to_the_same_state(keyring, sealing):
    led, recent = _scenario(sealing)
    body = encode_state(led.state, recent, c=keyring)
    # "likes tea", not "tea": three letters turn up by chance in a sealed value's base64 (a space never does).
    assert b"CANARY" not in body and b"likes tea" not in body
    state, _, dropped = decode_state(body, keyring)
    assert dropped == 0
    same(state, led.state, "opened")
    # Nor a hash of a text: a guessed text's uniqueness hash is not found in it.
    hashes = {k.rsplit(":", 1)[1] for k in led.state.index if "|text:" in k}
    assert hashes and not any(h.encode() in body for h in hashes)
    # without a cipher the same state is written as it is
    assert b"CANARY-u1 likes tea" in encode_state(led.state, OrderedDict())


@pytest.mark.parametrize(("subject", "erasure"), [("t/a|u:u1", "t/a|u:u1"), ("t/a", "t/a")])
def test_what_was_sealed_under_a_destroyed_key_is_dropped_when_a_snapshot_is_read(keyring, sealing, subject, erasure):
    led, recent = _scenario(sealing)
    body = encode_state(led.state, recent, c=keyring)
    for rec in keyring.kids(subject) + ([r for s in keyring.subjects() if s.startswith(f"{subject}|")
                                         for r in keyring.kids(s)] if "|" not in subject else []):
        keyring.apply(rec.topic_key, None)  # as the keys topic's tombstones do
    state, kept, dropped = decode_state(body, keyring)
    expected = copy.deepcopy(led.state)
    forget(expected, erasure)
    same(state, expected, "read after the erasure")
    assert dropped >= 2 and kept == [(k, None, v) for k, v in recent.items()]  # logged events stay as logged
    assert not any(b"CANARY-u1" in raw for raw in state.records.values())
    assert list(state.staged) == ([] if erasure == "t/a" else ["t/a|x:2:1"])  # u2's write stays


def test_a_sealed_snapshot_read_without_keys_is_refused(keyring, sealing):
    led, recent = _scenario(sealing)
    body = encode_state(led.state, recent, c=keyring)
    with pytest.raises(codec.ContractError, match="sealed"):
        decode_state(body)


def test_a_snapshot_without_the_erasures_does_not_decode():
    """Read as "none", a restarted ledger would not destroy the keys of an erasure it died before finishing."""
    body = msgspec.msgpack.decode(encode_state(LedgerState(), OrderedDict()))
    del body["erasures"]
    with pytest.raises(msgspec.ValidationError, match="erasures"):
        decode_state(msgspec.msgpack.encode(body))
