"""A rebuild gives the same subjects: over random grants, withdrawals, writes (user, agent and
session scope, some staged on turns, some made a while before they arrive), deletes and
erasures of several members, the state the ledger decided with equals the fold of its events
alone, the fold of their recovery views (`LedgerView`), and a snapshot taken anywhere plus the
events after it. And it is the right state: consent as granted, each member's live records,
counts that recount; and nothing is written for a member that was not made under the grant
in force, after the member's last erasure."""

from __future__ import annotations

from collections import OrderedDict
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from events import AgentConfig, ConfigureAgent, DeleteMemory, TurnOutcome, encode
from events.commands import AddMemory, EraseSubject, GrantConsent, WithdrawConsent
from events.lean import decode_ledger_view
from events.record import LIVE, MemoryRecord, Provenance, Scope, Source
from events.rules.ledger import RESERVED_KINDS, LedgerState, decide, evolve
from events.rules.ledger.subject_rules import count_key
from events.rules.tokens import pin_line_chars
from tests.unit.test_ledger_rules import NOW
from workers.processors.ledger.snapshot_file import decode_state, encode_state

USERS = ("u1", "u2", "u3")
TURNS = ("x:1:1", "x:2:1", "x:3:1", "x:4:1")
MEMORY = {"consent": "required", "pinned": {"max_tokens": 2000},
          "scope": {"read": ["session", "user", "agent"], "write": ["session", "user", "agent"]}}
FIELDS = ("records", "index", "staged", "open_turns", "turns", "stats", "consent", "granted_at", "erased_at",
          "removed_agents", "subject_records", "erasures")
# How many seconds before it reaches the ledger a write was made: most at once, some late (a
# lagging review, a retry), from before the grants, withdrawals and erasures just decided.
LAG = st.sampled_from((0, 0, 0, 2, 5, 12))

user = st.sampled_from(USERS)
add = st.tuples(st.just("add"), st.sampled_from((*USERS, *USERS, None)),
                st.sampled_from((None, "USER", "USER", "AGENT", "SESSION")), st.sampled_from((None, "s1", "s1", "s2")),
                st.integers(0, 4), st.sampled_from((None, "k")), st.sampled_from((None, None, *TURNS)), st.booleans(),
                LAG)
STEPS = {
    "add": add,
    "grant": st.tuples(st.just("grant"), user),
    "withdraw": st.tuples(st.just("withdraw"), user),
    "delete": st.tuples(st.just("delete"), st.integers(0, 50), st.sampled_from(("agent", "review", "member", "operator")),
                        user, LAG),
    "erase": st.tuples(st.just("erase"), user),
    "outcome": st.tuples(st.just("outcome"), st.sampled_from(TURNS), st.booleans()),
}
# Mostly writes, so that members hold records to delete and erase; grants often enough
# that most writes are allowed.
WEIGHTS = ("add",) * 10 + ("grant",) * 4 + ("delete",) * 2 + ("outcome",) * 2 + ("erase", "withdraw")
ops = st.sampled_from(WEIGHTS).flatmap(STEPS.__getitem__)


def _command(op, n: int, ids: list[str]):
    at = NOW + timedelta(seconds=n)
    base = dict(command_id=f"p{n}", tenant="t", agent="a", issued_at=at)
    kind = op[0]
    if kind == "grant":
        return GrantConsent(**base, user=op[1], provenance=Provenance(source=Source.MEMBER))
    if kind == "withdraw":
        return WithdrawConsent(**base, user=op[1])
    if kind == "erase":
        return EraseSubject(**base, user=op[1], provenance=Provenance(source=Source.OPERATOR))
    if kind == "outcome":
        return TurnOutcome(**base, turn_ref=op[1], committed=op[2])
    if kind == "add":
        _, u, scope, session, text, key, turn, pinned, lag = op
        return AddMemory(**{**base, "issued_at": at - timedelta(seconds=lag)}, user=u, scope=scope, session=session,
                         summary=f"fact {text} of {u}", key=key, turn_ref=turn, pinned=pinned)
    _, pick, who, u, lag = op
    rid = ids[pick % len(ids)] if ids else "no-such-record"
    if who == "operator":
        return DeleteMemory(**base, record_id=rid, provenance=Provenance(source=Source.OPERATOR))
    if who == "member":
        return DeleteMemory(**base, record_id=rid, user=u, provenance=Provenance(source=Source.MEMBER))
    made = {**base, "issued_at": at - timedelta(seconds=lag)}
    if who == "review":
        return DeleteMemory(**made, record_id=rid, user=u, session="s1", provenance=Provenance(source=Source.EXTRACTION))
    return DeleteMemory(**made, record_id=rid, user=u, session="s1")


def _recount(state: LedgerState) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    for raw in state.records.values():
        r = MemoryRecord.model_validate_json(raw)
        c = counts.setdefault(count_key("t/a", r), {"live": 0, "pinned_chars": 0})
        c["live"] += r.status in LIVE and r.kind not in RESERVED_KINDS
        c["pinned_chars"] += pin_line_chars(r) if r.pinned else 0
    return counts


def _live_by_member(state: LedgerState) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for raw in state.records.values():
        r = MemoryRecord.model_validate_json(raw)
        if r.scope is Scope.USER and r.status in LIVE:
            out.setdefault(r.user, set()).add(r.id)
    return out


def _same(a: LedgerState, b: LedgerState, how: str) -> None:
    for name in FIELDS:
        assert dict(getattr(a, name)) == dict(getattr(b, name)), f"{how}: {name}"


@settings(max_examples=300, deadline=None)
@given(st.sets(user), st.lists(ops, min_size=10, max_size=50), st.integers(0, 200))
def test_a_rebuild_gives_the_same_subjects(first, script, cut):
    script = [("grant", u) for u in sorted(first)] + script  # most scripts start with some members consenting
    config = ConfigureAgent(command_id="cfg", tenant="t", agent="a", issued_at=NOW,
                            config=AgentConfig.model_validate({"memory": MEMORY}))
    live, log, ids, consent, granted, erased, sent = LedgerState(), [], [], {}, {}, {}, {}

    def in_force(write) -> bool:
        """Whether the write's member has the grant in force, made no earlier than the write,
        and no erasure since it was made."""
        u, at = write.user, write.issued_at
        return bool(consent.get(u)) and at >= granted[u] and (u not in erased or at >= erased[u])

    for n, op in enumerate([None, *script]):
        cmd = config if op is None else _command(op, n, ids)
        sent[cmd.command_id] = cmd
        events = decide(live, cmd)
        for e in events:
            write = sent.get(e.command_id)
            if e.type == "RecordAdded" and not e.merged:
                # Nothing is written for a member without a grant, staged or not, nor what
                # was made before the grant in force or before an erasure.
                assert in_force(write), (op, write, consent, granted, erased)
                ids.append(e.record.id)
            if e.type == "RecordDeleted" and e.provenance.source in (Source.TOOL, Source.EXTRACTION):
                assert in_force(write), (op, write, consent, granted, erased)  # nor deleted by a review or tool
            if e.type == "CommandRejected" and e.reason.startswith("this write was made before"):
                assert write.user and not in_force(write), (e.reason, write)
            evolve(live, e)
        log += events
        if op and op[0] in ("grant", "withdraw", "erase"):
            consent[op[1]] = op[0] == "grant"
            if op[0] == "grant":
                granted[op[1]] = cmd.issued_at
            if op[0] == "erase":
                erased[op[1]] = cmd.issued_at

    replayed, lean = LedgerState(), LedgerState()
    for e in log:
        evolve(replayed, e)
        evolve(lean, decode_ledger_view(encode(e)))
    _same(replayed, live, "the events")
    _same(lean, live, "their recovery views")

    # A snapshot taken after any event, then the rest of the log as recovery folds it.
    cut = min(cut, len(log))
    before = LedgerState()
    for e in log[:cut]:
        evolve(before, decode_ledger_view(encode(e)))
    restored, _, _ = decode_state(encode_state(before, OrderedDict()))
    for e in log[cut:]:
        evolve(restored, decode_ledger_view(encode(e)))
    _same(restored, live, f"a snapshot after event {cut}")

    assert live.consent == {f"t/a|u:{u}": v for u, v in consent.items()}
    assert live.granted_at == {f"t/a|u:{u}": at for u, at in granted.items()}
    assert live.erased_at == {f"t/a|u:{u}": at for u, at in erased.items()}
    assert {k.split("|u:")[1]: set(v) for k, v in live.subject_records.items() if v} == _live_by_member(live)
    assert all(len(set(v)) == len(v) for v in live.subject_records.values())
    recount = _recount(live)
    assert {k: v for k, v in live.stats.items() if k in recount or v != {"live": 0, "pinned_chars": 0}} == recount
