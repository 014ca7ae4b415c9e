"""The memory ledger's rules: pure functions over the contract models.

`decide(state, command)` returns the events a command produces; `evolve(state, event)`
folds one event into the state. The ledger worker is these two functions plus Kafka.
The state is a handful of mappings of frozen models, folded from the ledger's own events, all
keyed under `tenant/agent` so one agent can never address another agent's records.

Everything here is deterministic in the command: ids and timestamps derive from the
command's tenant, agent and id and its `issued_at`, so a redelivered command produces
byte-identical events, and two agents that pick the same command id get different ids.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from events.base import command_key
from events.codec import decode_stored, encode
from events.commands import (
    BLOCK_CHARS,
    WORKSPACE,
    AddMemory,
    ConfigureAgent,
    CurateBlock,
    DeleteMemory,
    EditMemory,
    EraseSubject,
    ExpireTurns,
    GrantConsent,
    PinMemory,
    RemoveAgent,
    RemoveUser,
    ReportOutcome,
    SweepExpired,
    TurnOutcome,
    UnpinMemory,
    WithdrawConsent,
)
from events.config import AgentConfig, label_numbers_kept
from events.errors import ErrorCode
from events.lean import RECORD_EVENT_TYPES, LeanRecord, LedgerView, decode_lean_record
from events.limits import EVENT_LIMIT, largest_field, too_large
from events.memory import (
    AgentConfigured,
    AgentRemoved,
    BlockChanged,
    CommandRejected,
    ConsentGranted,
    ConsentWithdrawn,
    RecordAdded,
    RecordDeleted,
    RecordExpired,
    RecordPinned,
    RecordRevised,
    RecordSuperseded,
    RecordUnpinned,
    TurnResolved,
    UserRemoved,
    WriteDiscarded,
    WriteStaged,
)
from events.record import LIVE, MemoryRecord, Provenance, Scope, Source, Status
from events.rules import ledger_subjects as subjects
from events.rules.ledger_subjects import count_key, dup_scope, key_entry, key_slots_seen, slot, subject_key
from events.rules.tokens import CHARS_PER_TOKEN, pin_budget_chars, pin_line_chars
from events.rules.visibility import default_scope

NAMESPACE = uuid.UUID("5b0c2f57-3c2e-4a43-9d63-0f1d8f3a9a11")
MAX_EXPIRY = timedelta(days=180)
LIVE_FACT_CAP = 200
RESERVED_KINDS = ("episode", "procedure")  # written by consolidation only (events.rules.consolidation)
MAX_BLOCKS = 10  # labels per agent: blocks come with every recall, so they stay few
# How long a turn's staged writes wait for its outcome; the default of `decide` and `overdue`,
# whose caller (the ledger worker) passes the configured one.
TURN_TIMEOUT = timedelta(minutes=10)
# How long, in event time, a resolved turn's outcome is remembered: at least this, at most
# twice. A write or an outcome that names an older turn is treated as if the turn were
# open (it waits the turn timeout, then is discarded). Kept forever, the outcomes grew by one
# entry per turn for the life of the ledger.
TURN_MEMORY = timedelta(days=1)


@dataclass
class LedgerState:
    # agent/rid -> the record's current version as JSON, parsed when a rule reads it: a
    # parsed MemoryRecord held 5.3 kB of memory against 0.9 kB for its JSON, and the ledger
    # keeps every record it ever made (tombstones and superseded versions too).
    records: MutableMapping[str, bytes] = field(default_factory=dict)
    index: MutableMapping[str, str] = field(default_factory=dict)  # agent|text:h / agent|key:k -> rid
    staged: MutableMapping[str, list] = field(default_factory=dict)  # agent|turn_ref -> [command dicts]
    # agent -> {its staged key: when the turn's first write was issued}; replaced, never mutated
    open_turns: MutableMapping[str, Mapping[str, datetime]] = field(default_factory=dict)
    turns: MutableMapping[str, str] = field(default_factory=dict)  # agent|turn_ref -> outcome, this window
    turns_before: Mapping[str, str] = field(default_factory=dict)  # the same, the window before
    turns_since: datetime | None = None  # event time the current window of `turns` began
    configs: MutableMapping[str, AgentConfig] = field(default_factory=dict)  # agent -> config (frozen)
    blocks: MutableMapping[str, Mapping[str, str]] = field(default_factory=dict)  # agent -> {label: text}; replaced
    # agent, or agent|u:user for USER records (`count_key`) -> {live, pinned_chars}
    stats: MutableMapping[str, Any] = field(default_factory=dict)
    consent: MutableMapping[str, bool] = field(default_factory=dict)  # agent|u:user -> granted (else withdrawn)
    # agent|u:user -> when the grant in force was given, and when the member's memory was last
    # erased: a write made before either is refused however late it arrives (`ledger_subjects`).
    granted_at: MutableMapping[str, datetime] = field(default_factory=dict)
    erased_at: MutableMapping[str, datetime] = field(default_factory=dict)
    removed_agents: MutableMapping[str, bool] = field(default_factory=dict)  # agent -> True once removed
    # tenant/@workspace|u:user -> True: a member removed tenant-wide. Kept for audit (a rebuild and
    # a snapshot show who was removed, and when the log says so); no rule reads it. It is folded
    # on the workspace's partition only, which the ledger partitions of the tenant's agents do not
    # read: the read side (the record view's removal marker) and the workers' subject check are
    # what guard a removed member's memory (docs/subjects.md, "Removal").
    removed_users: MutableMapping[str, bool] = field(default_factory=dict)
    # agent|u:user -> the subject's live USER record ids (`ledger_subjects.track`); replaced, never mutated
    subject_records: MutableMapping[str, tuple[str, ...]] = field(default_factory=dict)


class Rejected(Exception):
    def __init__(self, code: ErrorCode, field: str | None, reason: str) -> None:
        super().__init__(reason)
        self.code, self.field, self.reason = code, field, reason


def event_id(tenant: str, agent: str, command_id: str, n: int) -> str:
    return str(uuid.uuid5(NAMESPACE, f"{command_key(tenant, agent, command_id)}#{n}"))


def record_id_for(tenant: str, agent: str, command_id: str) -> str:
    return str(uuid.uuid5(NAMESPACE, f"record:{command_key(tenant, agent, command_id)}"))


def agent_key(tenant: str, agent: str) -> str:
    return f"{tenant}/{agent}"


def normalized_hash(summary: str, content: str) -> str:
    """Restated facts collide here: case, punctuation and spacing do not count."""
    text = re.sub(r"[^\w]+", " ", f"{summary} {content}".lower()).strip()
    return hashlib.sha256(text.encode()).hexdigest()[:24]


DEFAULT_CONFIG = AgentConfig()  # frozen, so one instance serves every unconfigured agent


def config_of(state: LedgerState, ak: str) -> AgentConfig:
    return state.configs.get(ak) or DEFAULT_CONFIG


def outcome_of(state: LedgerState, key: str) -> str | None:
    """A resolved turn's outcome (`agent|turn_ref`), if it is still remembered."""
    return state.turns.get(key) or state.turns_before.get(key)


def get_record(state: LedgerState, ak: str, rid: str) -> MemoryRecord | None:
    raw = state.records.get(f"{ak}/{rid}")
    return MemoryRecord.model_validate_json(raw) if raw is not None else None


# --------------------------------------------------------------------------- decide


def decide(state: LedgerState, cmd: Any, turn_timeout: timedelta = TURN_TIMEOUT) -> list[Any]:
    """The events `cmd` produces. Event ids are the command's key plus a position. Writes
    staged on a turn whose first write is `turn_timeout` older than `cmd` are discarded first."""
    ak = agent_key(cmd.tenant, cmd.agent)
    expired = _expire_turns(state, ak, cmd, turn_timeout)
    if expired:
        state = _scratch(state)
        for e in expired:
            evolve(state, e)
    events = expired + _decide(state, ak, cmd)
    n = len(events)
    return [
        e.model_copy(update={"event_id": event_id(cmd.tenant, cmd.agent, cmd.command_id, i), "last": i == n - 1}) for i, e in enumerate(events)
    ]


def refused(cmd: Any, code: ErrorCode, field: str | None, reason: str) -> list[CommandRejected]:
    """What the ledger emits in place of events it cannot write (one over the message limit,
    or a command its rules failed on): the caller gets an answer, and the partition moves on."""
    e = _rejection(cmd, Rejected(code, field, reason))
    return [e.model_copy(update={"event_id": event_id(cmd.tenant, cmd.agent, cmd.command_id, 0), "last": True})]


def caller(cmd: Any) -> str:
    """Who gave a command, as far as a reused command id matters: its type, its source, its
    member and its session. A retry (an API retry, a review retried from the dead-letter
    topic) is rebuilt with a new `issued_at` but the same caller; another member, another
    session, an operator or a member's key reusing a known id is another caller, and gets a
    refusal (`reused`), never the events the first caller's command produced."""
    session = getattr(cmd, "session", None) or cmd.provenance.session
    parts = [cmd.type, cmd.provenance.source.value, cmd.user, session]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


def reused(cmd: Any) -> list[CommandRejected]:
    """The answer to a command whose id its agent already took from another caller
    (`caller`). Its event id is its own (derived from the caller too), not the first
    command's."""
    e = _rejection(cmd, Rejected(ErrorCode.DUPLICATE_ID, "command_id",
                                 f"command id {cmd.command_id} was already used by another caller; use a new id"))
    eid = str(uuid.uuid5(NAMESPACE, f"{command_key(cmd.tenant, cmd.agent, cmd.command_id)}#reused:{caller(cmd)}"))
    return [e.model_copy(update={"event_id": eid, "last": True})]


def oversized(cmd: Any, raws: list[bytes]) -> list[CommandRejected] | None:
    """A refusal naming the command's largest field when one of its encoded events is over
    `EVENT_LIMIT`, so no event the broker would refuse is ever sent; else None."""
    size = max((len(r) for r in raws), default=0)
    if size <= EVENT_LIMIT:
        return None
    field = largest_field(cmd)
    reason = too_large("an event of this command", size, EVENT_LIMIT, field)
    return refused(cmd, ErrorCode.LIMIT_EXCEEDED, field, reason)


def overdue(state: LedgerState, now: datetime, turn_timeout: timedelta = TURN_TIMEOUT) -> list[ExpireTurns]:
    """An `ExpireTurns` for each agent with a turn whose first write is `turn_timeout` old
    at `now`. Its id names the agent and that turn, so asking again for the same turn sends
    the same command."""
    out = []
    for ak, opened in state.open_turns.items():
        # One command expires all of the agent's overdue turns; it is named after the oldest.
        key, first = min(opened.items(), key=lambda kv: kv[1])
        if now - first >= turn_timeout:
            tenant, agent = ak.split("/", 1)  # an Ident has no "/"
            out.append(
                ExpireTurns(
                    command_id=f"expire-turns:{uuid.uuid5(NAMESPACE, key)}",
                    tenant=tenant,
                    agent=agent,
                    issued_at=now,
                    provenance=Provenance(source=Source.OPERATOR, modified_by="ledger"),
                )
            )
    return out


def _expire_turns(state: LedgerState, ak: str, cmd: Any, turn_timeout: timedelta) -> list[Any]:
    """Writes staged on a turn whose outcome never came are discarded after `turn_timeout`.

    Time is the command's own `issued_at`, so a replay decides exactly the same.
    """
    out: list[Any] = []
    prefix = f"{ak}|"
    # Only this agent's open turns, aged by their first write's time: scanning every staged
    # key cost each command a pass over every open turn of every agent of the partition, and
    # decoding writes to age them cost a decode per open turn. Writes are decoded only for
    # a turn that timed out.
    for key, first in (state.open_turns.get(ak) or {}).items():
        if cmd.issued_at - first < turn_timeout:
            continue
        ref = key[len(prefix) :]
        if isinstance(cmd, TurnOutcome) and cmd.turn_ref == ref:
            continue  # the outcome itself arrived: let it decide
        writes = [decode_stored("memlane.memory.commands", raw) for raw in state.staged.get(key) or []]
        out.append(_base(TurnResolved, cmd, turn_ref=ref, committed=False, timed_out=True))
        reason = f"turn timed out: no outcome within {int(turn_timeout.total_seconds())} s"
        out.extend(_base(WriteDiscarded, w, turn_ref=ref, reason=reason) for w in writes)
    return out


# A command handler appends the command's events to `events`, or raises `Rejected`.
Handler = Callable[[LedgerState, str, Any, list], None]


def _decide(state: LedgerState, ak: str, cmd: Any) -> list[Any]:
    events: list[Any] = []
    try:
        _admit(state, ak, cmd)
        _COMMANDS.get(type(cmd), _write)(state, ak, cmd, events)
    except Rejected as r:
        events = [_rejection(cmd, r)]
    return events


def _admit(state: LedgerState, ak: str, cmd: Any) -> None:
    """Refuses a command its agent or subject may not give now (`ledger_subjects.admission`).
    Asked before any command is decided (a write is refused before it is staged) and again as
    each staged write is applied, so nothing is written after a removal's or a withdrawal's event."""
    why = subjects.admission(state, ak, cmd, config_of(state, ak))
    if why is not None:
        raise Rejected(*why)


def _write(state: LedgerState, ak: str, cmd: Any, events: list) -> None:
    """A write (any command but the turn and configuration ones): staged while its turn is
    open, applied once the turn committed, discarded if it did not."""
    if not cmd.turn_ref:
        _apply_write(state, ak, cmd, events)
        return
    outcome = outcome_of(state, f"{ak}|{cmd.turn_ref}")
    if outcome is None:
        _validate_write(state, ak, cmd)
        events.append(_base(WriteStaged, cmd, turn_ref=cmd.turn_ref, command=encode(cmd).decode()))
    elif outcome == "committed":
        _apply_write(state, ak, cmd, events)
    else:
        events.append(_base(WriteDiscarded, cmd, turn_ref=cmd.turn_ref, reason=f"turn {outcome}"))


def _expire(state: LedgerState, ak: str, cmd: ExpireTurns, events: list) -> None:
    """Nothing of its own: `decide` expires every overdue turn of the agent before any command."""


def _base(cls: type, cmd: Any, **fields: Any) -> Any:
    return cls(
        event_id="pending",
        command_id=cmd.command_id,
        tenant=cmd.tenant,
        agent=cmd.agent,
        occurred_at=cmd.issued_at,
        provenance=cmd.provenance,
        **fields,
    )


def _rejection(cmd: Any, r: Rejected) -> CommandRejected:
    return _base(CommandRejected, cmd, code=r.code, field=r.field, reason=r.reason)


def _configure(state: LedgerState, ak: str, cmd: ConfigureAgent, events: list) -> None:
    old = state.configs.get(ak)
    if old:
        changed = label_numbers_kept(old, cmd.config)
        if changed:
            raise Rejected(
                ErrorCode.VALIDATION_FAILED,
                f"memory.labels.{changed}",
                f"label {changed!r} was declared with a number; it keeps that number and cannot be removed",
            )
    events.append(_base(AgentConfigured, cmd, config=cmd.config))


def _turn_outcome(state: LedgerState, ak: str, cmd: TurnOutcome, events: list) -> None:
    ref = f"{ak}|{cmd.turn_ref}"
    if outcome_of(state, ref) is not None:
        return  # already resolved: a forwarded outcome seen twice changes nothing
    events.append(_base(TurnResolved, cmd, turn_ref=cmd.turn_ref, committed=cmd.committed))
    # Apply staged writes against a scratch copy, so later writes of the turn see earlier ones
    # without this function touching the real state (evolve does that, from the events).
    scratch = _scratch(state)
    for raw in state.staged.get(ref) or []:
        write = _in_turn(decode_stored("memlane.memory.commands", raw), cmd.provenance)
        if not cmd.committed:
            reason = cmd.reason or "turn rolled back"
            events.append(_base(WriteDiscarded, write, turn_ref=cmd.turn_ref, reason=reason))
            continue
        sub: list[Any] = []
        try:
            _admit(scratch, ak, write)  # a removal or a withdrawal since it was staged refuses it
            _apply_write(scratch, ak, write, sub)
        except Rejected as r:
            sub = [_rejection(write, r)]
        for e in sub:
            evolve(scratch, e)
        events.extend(sub)


def _in_turn(write: Any, turn: Provenance) -> Any:
    """A write made during a turn names that turn (each record names the execution,
    invocation, agent version and session that wrote it). A call over HTTP knows only its
    turn reference; the turn's outcome carries the rest, and fills what the write left out."""
    known = write.provenance.model_dump(exclude_none=True)
    fill = {k: getattr(turn, k) for k in ("execution_id", "invocation", "agent_version", "session", "turn")
            if k not in known and getattr(turn, k) is not None}
    return write.model_copy(update={"provenance": write.provenance.model_copy(update=fill)}) if fill else write


def _scratch(state: LedgerState) -> LedgerState:
    """A copy-on-write view: reads fall through to `state`, writes stay local."""
    from collections import ChainMap

    return LedgerState(
        records=ChainMap({}, state.records),
        index=_Overlay(state.index),
        staged=ChainMap({}, state.staged),
        open_turns=ChainMap({}, state.open_turns),
        turns=ChainMap({}, state.turns),
        turns_before=state.turns_before,
        turns_since=state.turns_since,
        configs=ChainMap({}, state.configs),
        blocks=ChainMap({}, state.blocks),
        stats=ChainMap({}, state.stats),
        consent=ChainMap({}, state.consent),
        granted_at=ChainMap({}, state.granted_at),
        erased_at=ChainMap({}, state.erased_at),
        removed_agents=ChainMap({}, state.removed_agents),
        removed_users=ChainMap({}, state.removed_users),
        subject_records=ChainMap({}, state.subject_records),
    )


class _Overlay(dict):
    """Dict overlay that can also hide deleted keys of the base mapping."""

    def __init__(self, base: MutableMapping[str, str]) -> None:
        super().__init__()
        self._base, self._gone = base, set()

    def get(self, k, default=None):
        if k in self._gone:
            return default
        return super().get(k, self._base.get(k, default))

    def setdefault(self, k, v):
        cur = self.get(k)
        if cur is None:
            self[k] = v
            self._gone.discard(k)
            return v
        return cur

    def __delitem__(self, k):
        self._gone.add(k)
        super().pop(k, None)


def _validate_write(state: LedgerState, ak: str, cmd: Any) -> None:
    """The rules a write is held to before it is staged: only a new record's (raises `Rejected`)."""
    if type(cmd) is AddMemory:
        _new_record(state, ak, _members_stay_members(state, ak, cmd))


def _apply_write(state: LedgerState, ak: str, cmd: Any, events: list) -> None:
    handler = _WRITES.get(type(cmd))
    if handler is not None:
        handler(state, ak, cmd, events)


def _scope_for(cfg: AgentConfig, cmd: AddMemory) -> Scope:
    """A write that names no scope takes `visibility.default_scope` (its member's when it
    names one, else its session's, else the agent's), the rule extraction proposes with;
    one that names a scope must be allowed to write it."""
    write = cfg.memory.scope.write
    if cmd.scope is None:
        return default_scope(write, cmd.session, cmd.user)
    if cmd.scope.value.lower() not in write:
        raise Rejected(
            ErrorCode.SCOPE_NOT_ALLOWED,
            "scope",
            f"scope {cmd.scope.value} is not allowed: memory.scope.write is {write}",
        )
    return cmd.scope


def _new_record(state: LedgerState, ak: str, cmd: AddMemory, operator: bool = False) -> MemoryRecord:
    cfg = config_of(state, ak)
    if not cfg.memory.enabled:
        raise Rejected(ErrorCode.MEMORY_DISABLED, "memory.enabled", "memory is not enabled for this agent")
    if cmd.kind in RESERVED_KINDS:
        # Episodes and procedures are what consolidation makes of sessions (docs/consolidation.md).
        if cmd.provenance.source is not Source.CONSOLIDATION and not operator:
            raise Rejected(ErrorCode.VALIDATION_FAILED, "kind", f"kind {cmd.kind!r} is reserved for consolidation")
    elif cmd.kind not in cfg.memory.kinds:
        raise Rejected(
            ErrorCode.VALIDATION_FAILED,
            "kind",
            f"kind {cmd.kind!r} is not declared; declared kinds: {', '.join(cfg.memory.kinds)}",
        )
    for name in cmd.labels:
        if name not in cfg.memory.labels:
            raise Rejected(ErrorCode.VALIDATION_FAILED, f"labels.{name}",
                           f"label {name!r} is not declared in memory.labels")
    # An operator edits records of any scope; the agent writes only what scope.write allows.
    scope = cmd.scope if operator and cmd.scope else _scope_for(cfg, cmd)
    if scope is Scope.SESSION and not cmd.session:
        raise Rejected(ErrorCode.VALIDATION_FAILED, "session", "session scope requires a session")
    if scope is Scope.USER and not cmd.user:
        raise Rejected(ErrorCode.VALIDATION_FAILED, "user", "user scope requires a user: name the member (X-User)")
    limit = cfg.memory.fact_chars
    size = len(cmd.summary) + len(cmd.content)
    if limit is not None and size > limit and cmd.kind not in RESERVED_KINDS:
        # Episodes and procedures are not facts: they retell a session, and the cap counts facts only.
        raise Rejected(ErrorCode.LIMIT_EXCEEDED, "content",
                       f"the fact holds {size} characters (summary and content), over memory.fact_chars={limit}; "
                       "shorten it or split it into several facts")
    if cmd.pinned and cfg.memory.pinned is None:
        raise Rejected(ErrorCode.PIN_NOT_ENABLED, "pinned", "pinning is off: memory.pinned is not configured")
    latest = cmd.issued_at + MAX_EXPIRY
    expires = min(cmd.expires_at, latest) if cmd.expires_at else latest
    rid = cmd.record_id or record_id_for(cmd.tenant, cmd.agent, cmd.command_id)
    p = cmd.provenance
    return MemoryRecord(
        id=rid,
        version=1,
        created=cmd.issued_at,
        modified=cmd.issued_at,
        tenant=cmd.tenant,
        agent=cmd.agent,
        scope=scope,
        session=cmd.session,
        user=cmd.user,
        kind=cmd.kind,
        summary=cmd.summary,
        content=cmd.content,
        metadata=cmd.metadata,
        labels=cmd.labels,
        key=cmd.key,
        confidence=cmd.confidence,
        expires_at=expires,
        status=Status.ACTIVE,
        pinned=cmd.pinned,
        replaces=cmd.replaces,
        preview=cmd.preview,
        provenance=p,
        observed_at=cmd.observed_at or cmd.issued_at,
        valid_from=cmd.valid_from or cmd.observed_at or cmd.issued_at,
        recorded_at=cmd.issued_at,
    )


def _visible(r: MemoryRecord, cmd: Any) -> bool:
    """A command addresses a record only within its own session and preview rules.

    A SESSION record never reaches another session, and an agent without a
    session has no session scope, so an agent's command without a session reaches no
    SESSION record. An operator's reaches every session (`deleteAgentMemory` deletes any
    of the agent's records). A USER record is its member's (`ledger_subjects.may_address`)."""
    if not subjects.may_address(r, cmd):
        return False
    if r.scope is Scope.SESSION and cmd.provenance.source is not Source.OPERATOR and getattr(cmd, "session", None) != r.session:
        return False
    if r.preview and not cmd.preview:
        return False
    return True


def _addressed(state: LedgerState, ak: str, cmd: Any, rid: str, field: str = "record_id") -> MemoryRecord:
    """The record `cmd` names in `field`, if it exists and `cmd` may address it (`_visible`);
    else the same NOT_FOUND either way, so a command learns nothing of records it cannot see."""
    r = get_record(state, ak, rid)
    if r is None or not _visible(r, cmd):
        raise Rejected(ErrorCode.NOT_FOUND, field, f"record {rid} does not exist for this agent")
    return r


def _members_stay_members(state: LedgerState, ak: str, cmd: AddMemory) -> AddMemory:
    """A replacement of a member's fact (a USER record) is the member's too: scope USER and the
    old record's user, whatever scope the write defaulted to, so a replacement never moves a
    member's fact into session or agent scope. One that asks for another scope is refused.
    A record the write may not address is left to `_addressed` (the same NOT_FOUND as ever)."""
    old = get_record(state, ak, cmd.replaces) if cmd.replaces else None
    if old is None or old.scope is not Scope.USER or not _visible(old, cmd):
        return cmd
    if cmd.scope is not None and cmd.scope is not Scope.USER:
        raise Rejected(ErrorCode.SCOPE_NOT_ALLOWED, "scope",
                       f"record {old.id} is a member's fact in scope USER; its replacement stays in scope USER, "
                       f"not {cmd.scope.value}")
    if cmd.scope is Scope.USER and cmd.user == old.user:
        return cmd
    return cmd.model_copy(update={"scope": Scope.USER, "user": old.user})


def _add(state: LedgerState, ak: str, cmd: AddMemory, events: list, operator: bool = False) -> None:
    if not operator:  # an operator's edit makes its successor in the old record's scope already
        cmd = _members_stay_members(state, ak, cmd)
    rec = _new_record(state, ak, cmd, operator)
    if get_record(state, ak, rec.id):
        raise Rejected(ErrorCode.DUPLICATE_ID, "record_id", f"record {rec.id} already exists")
    stats = state.stats.get(count_key(ak, rec)) or {"live": 0, "pinned_chars": 0}
    h = normalized_hash(cmd.summary, cmd.content)
    same = state.index.get(f"{ak}|text:{dup_scope(rec)}:{h}")
    if same and not cmd.replaces:
        existing = get_record(state, ak, same)
        if existing and existing.status in LIVE:
            events.append(_base(RecordAdded, cmd, record=existing, merged=True))
            return
    old: MemoryRecord | None = None
    if cmd.replaces:
        old = _addressed(state, ak, cmd, cmd.replaces, "replaces")
        if old.status not in LIVE:
            raise Rejected(
                ErrorCode.NOT_LIVE, "replaces",
                f"record {cmd.replaces} is {old.status.value}; only a live record can be replaced",
            )
        # Labels stay once declared: the successor keeps the old values it does not override.
        rec = rec.model_copy(update={"labels": {**old.labels, **rec.labels}})
    if rec.key and not old:
        holders = (state.index.get(f"{ak}|key:{key_entry(seen, rec.kind, rec.key)}") for seen in key_slots_seen(rec))
        holder_rec = next((r for h in holders if h and (r := get_record(state, ak, h))), None)
        if holder_rec and holder_rec.status in LIVE:
            # A disagreement with a stored fact is kept, as CONFLICT, and never injected.
            rec = rec.model_copy(update={"status": Status.CONFLICT})
        elif cmd.pending:
            # ... and one within a batch, with no stored fact, as PENDING.
            rec = rec.model_copy(update={"status": Status.PENDING})
    if rec.kind == "episode" and not old:
        # An episode links the previous one. Linked here, in log order, so two
        # sessions ending together cannot both claim the same predecessor, and a replay
        # links the same.
        rec = rec.model_copy(update={"metadata": {**rec.metadata, "previous_episode": _last_episode(state, ak, rec)}})
    if not old and rec.kind not in RESERVED_KINDS and stats["live"] >= LIVE_FACT_CAP:
        # A member's facts are capped per member (`count_key`), the others per agent.
        n = stats["live"]
        holds = (f"the member holds {n} live facts on this agent" if rec.scope is Scope.USER
                 else f"the agent holds {n} live facts")
        raise Rejected(ErrorCode.LIMIT_EXCEEDED, "summary",
                       f"{holds}, the cap is {LIVE_FACT_CAP}; replace or delete facts first")
    if rec.pinned:
        _check_pin_budget(state, ak, rec, stats, freed=pin_line_chars(old) if old and old.pinned else 0)
    if old and old.preview == rec.preview:
        superseded = old.model_copy(
            update={
                "version": old.version + 1,
                "status": Status.SUPERSEDED,
                "replaced_by": rec.id,
                "modified": cmd.issued_at,
                "superseded_at": cmd.issued_at,
                "valid_to": rec.valid_from,
                "pinned": False,
                "provenance": cmd.provenance,
            }
        )
        events.append(_base(RecordSuperseded, cmd, record=superseded))
    # A preview write that names a live record shadows it and leaves it untouched.
    events.append(_base(RecordAdded, cmd, record=rec))


def _edit(state: LedgerState, ak: str, cmd: EditMemory, events: list) -> None:
    """An operator's edit, or a member's of their own fact, bypasses the write-time filter;
    the same text changes nothing (a PENDING or CONFLICT record stays out of the prompt); new
    text makes a successor, in the same scope, and needs the member's consent."""
    old = _addressed(state, ak, cmd, cmd.record_id)
    if old.status not in LIVE:
        raise Rejected(ErrorCode.NOT_LIVE, "record_id",
                       f"record {old.id} is {old.status.value}; only a live record can be edited")
    summary = old.summary if cmd.summary is None else cmd.summary
    content = old.content if cmd.content is None else cmd.content
    metadata = old.metadata if cmd.metadata is None else cmd.metadata
    if (summary, content, metadata) == (old.summary, old.content, old.metadata):
        events.append(_base(RecordAdded, cmd, record=old, merged=True))
        return
    if why := subjects.consent_refusal(state, ak, cmd, config_of(state, ak)):
        raise Rejected(*why)
    successor = AddMemory(
        command_id=cmd.command_id,
        tenant=cmd.tenant,
        agent=cmd.agent,
        issued_at=cmd.issued_at,
        provenance=cmd.provenance,
        preview=old.preview,
        summary=summary,
        content=content,
        metadata=metadata,
        kind=old.kind,
        labels=old.labels,
        scope=old.scope,
        session=old.session,
        user=old.user,
        pinned=old.pinned,
        replaces=old.id,
        key=old.key,
        confidence=old.confidence,
        expires_at=old.expires_at,
    )
    _add(state, ak, successor, events, operator=True)


def _curate(state: LedgerState, ak: str, cmd: CurateBlock, events: list) -> None:
    """A block is kept line by line, up to `BLOCK_CHARS`. A line already there is
    not added twice; `replace` and `remove` name the line to change as it is now."""
    if not config_of(state, ak).memory.enabled:
        raise Rejected(ErrorCode.MEMORY_DISABLED, "memory.enabled", "memory is not enabled for this agent")
    if cmd.preview:
        raise Rejected(ErrorCode.PREVIEW_READ_ONLY, "label",
                       "blocks are live memory for every turn; a preview turn cannot change them")
    blocks = state.blocks.get(ak) or {}
    if cmd.label not in blocks and len(blocks) >= MAX_BLOCKS:
        raise Rejected(ErrorCode.LIMIT_EXCEEDED, "label",
                       f"the agent has {len(blocks)} blocks, the limit is {MAX_BLOCKS}; add to one of them or empty one")
    text = blocks.get(cmd.label, "")
    lines = text.split("\n") if text else []
    if cmd.action == "add":
        lines = lines if cmd.line in lines else [*lines, cmd.line]
    else:
        if cmd.old not in lines:
            raise Rejected(ErrorCode.NOT_FOUND, "old",
                           f"block {cmd.label!r} has no line {cmd.old[:80]!r}; read the block first")
        at = lines.index(cmd.old)
        lines = [*lines[:at], *([cmd.line] if cmd.action == "replace" else []), *lines[at + 1 :]]
    new = "\n".join(dict.fromkeys(lines))
    if len(new) > BLOCK_CHARS:
        raise Rejected(
            ErrorCode.LIMIT_EXCEEDED, "line",
            f"block {cmd.label!r} would hold {len(new)} characters, over the limit of {BLOCK_CHARS}; replace or remove lines",
        )
    events.append(_base(BlockChanged, cmd, label=cmd.label, text=new))


def _report(state: LedgerState, ak: str, cmd: ReportOutcome, events: list) -> None:
    """Each procedure counts its validations, successes and failures."""
    r = _addressed(state, ak, cmd, cmd.record_id)
    if r.kind != "procedure":
        raise Rejected(ErrorCode.VALIDATION_FAILED, "record_id",
                       f"record {r.id} is a {r.kind}; only procedures take outcomes")
    if cmd.preview and not r.preview:
        raise Rejected(ErrorCode.PREVIEW_READ_ONLY, "record_id",
                       f"record {r.id} was written by a live turn; a preview turn cannot change it")
    if r.status is not Status.ACTIVE:
        raise Rejected(ErrorCode.NOT_LIVE, "record_id",
                       f"record {r.id} is {r.status.value}; only ACTIVE procedures take outcomes")
    m = dict(r.metadata)
    counted = "successes" if cmd.success else "failures"
    m["validations"] = int(m.get("validations", 0)) + 1
    m[counted] = int(m.get(counted, 0)) + 1
    revised = r.model_copy(
        update={"version": r.version + 1, "metadata": m, "modified": cmd.issued_at, "provenance": cmd.provenance}
    )
    events.append(_base(RecordRevised, cmd, record=revised))


def _sweep(state: LedgerState, ak: str, cmd: SweepExpired, events: list) -> None:
    """Tombstone the named live records past `expires_at`, as of the command's own time."""
    for rid in dict.fromkeys(cmd.record_ids):
        r = get_record(state, ak, rid)
        if r is None or r.status not in LIVE or r.expires_at is None or r.expires_at > cmd.issued_at:
            continue
        events.append(_base(RecordExpired, cmd, record=_tombstone(r, cmd, valid_to=r.expires_at)))


def _check_pin_budget(state: LedgerState, ak: str, rec: MemoryRecord, stats: dict, freed: int = 0) -> None:
    cfg = config_of(state, ak)
    if cfg.memory.pinned is None:
        raise Rejected(ErrorCode.PIN_NOT_ENABLED, "pinned", "pinning is off: memory.pinned is not configured")
    budget = pin_budget_chars(cfg.memory.pinned.max_tokens)
    used = stats["pinned_chars"] - freed
    need = pin_line_chars(rec)
    if used + need > budget:
        raise Rejected(
            ErrorCode.PIN_BUDGET_EXCEEDED,
            "pinned",
            f"pinning needs ~{(used + need) // CHARS_PER_TOKEN} tokens, over pinned.max_tokens="
            f"{cfg.memory.pinned.max_tokens}; consolidate: replace several pins with one",
        )


def _delete(state: LedgerState, ak: str, cmd: DeleteMemory, events: list) -> None:
    r = _addressed(state, ak, cmd, cmd.record_id)
    write = config_of(state, ak).memory.scope.write
    # A member deletes their own facts whatever the agent may write now.
    if cmd.provenance.source is not Source.MEMBER and r.scope.value.lower() not in write:
        raise Rejected(ErrorCode.SCOPE_NOT_ALLOWED, "record_id",
                       f"{r.scope.value} records are outside memory.scope.write {write}")
    if r.status is Status.DELETED:
        events.append(_base(RecordDeleted, cmd, record=r))  # unchanged
        return
    if cmd.preview and not r.preview:
        tomb = _new_preview_tombstone(r, cmd)
        events.append(_base(RecordDeleted, cmd, record=tomb))
        return
    events.append(_base(RecordDeleted, cmd, record=_tombstone(r, cmd, valid_to=cmd.issued_at)))


def _tombstone(r: MemoryRecord, cmd: Any, valid_to: datetime) -> MemoryRecord:
    """The record's next version, DELETED: it stays readable in history, never recalled."""
    return r.model_copy(
        update={
            "version": r.version + 1,
            "status": Status.DELETED,
            "pinned": False,
            "modified": cmd.issued_at,
            "valid_to": r.valid_to or valid_to,
            "provenance": cmd.provenance,
        }
    )


def _new_preview_tombstone(r: MemoryRecord, cmd: DeleteMemory) -> MemoryRecord:
    return r.model_copy(
        update={
            "id": record_id_for(cmd.tenant, cmd.agent, cmd.command_id),
            "version": 1,
            "created": cmd.issued_at,
            "modified": cmd.issued_at,
            "status": Status.DELETED,
            "preview": True,
            "pinned": False,
            "replaces": r.id,
            "replaced_by": None,
            "provenance": cmd.provenance,
        }
    )


def _pin(state: LedgerState, ak: str, cmd: PinMemory | UnpinMemory, events: list) -> None:
    r = _addressed(state, ak, cmd, cmd.record_id)
    want = isinstance(cmd, PinMemory)
    if cmd.preview and not r.preview:
        # A turn in preview mode never changes a record a live turn wrote.
        raise Rejected(
            ErrorCode.PREVIEW_READ_ONLY, "record_id",
            f"record {r.id} was written by a live turn; a preview turn cannot pin or unpin it",
        )
    if want and r.status is not Status.ACTIVE:
        raise Rejected(ErrorCode.NOT_LIVE, "record_id",
                       f"record {r.id} is {r.status.value}; only ACTIVE records can be pinned")
    if r.pinned == want:
        events.append(_base(RecordPinned if want else RecordUnpinned, cmd, record=r))
        return
    if want:
        _check_pin_budget(state, ak, r, state.stats.get(count_key(ak, r)) or {"live": 0, "pinned_chars": 0})
    changed = r.model_copy(
        update={"version": r.version + 1, "pinned": want, "modified": cmd.issued_at, "provenance": cmd.provenance}
    )
    events.append(_base(RecordPinned if want else RecordUnpinned, cmd, record=changed))


def _member(cmd: Any) -> str:
    """The member a subject command is about."""
    if not cmd.user:
        raise Rejected(ErrorCode.VALIDATION_FAILED, "user", f"{cmd.type} is about a member: name the user")
    return cmd.user


def _consent(state: LedgerState, ak: str, cmd: GrantConsent | WithdrawConsent, events: list) -> None:
    """Written again when asked again, rather than nothing: the caller waits for an event,
    and the fold of a second grant changes nothing."""
    cls = ConsentGranted if type(cmd) is GrantConsent else ConsentWithdrawn
    events.append(_base(cls, cmd, user=_member(cmd)))


def _erase(state: LedgerState, ak: str, cmd: EraseSubject, events: list) -> None:
    """Tombstones every live USER record of the member on this agent, and withdraws the
    consent: a later write needs a new grant. Other scopes' records are not the member's."""
    user = _member(cmd)
    for rid in state.subject_records.get(subject_key(ak, user)) or ():
        r = get_record(state, ak, rid)
        events.append(_base(RecordDeleted, cmd, record=_tombstone(r, cmd, valid_to=cmd.issued_at)))
    events.append(_base(ConsentWithdrawn, cmd, user=user, erased=True))


def _remove_agent(state: LedgerState, ak: str, cmd: RemoveAgent, events: list) -> None:
    events.append(_base(AgentRemoved, cmd))


def _remove_user(state: LedgerState, ak: str, cmd: RemoveUser, events: list) -> None:
    if cmd.agent != WORKSPACE:
        raise Rejected(ErrorCode.VALIDATION_FAILED, "agent",
                       f"a member is removed from the whole tenant: send RemoveUser under {WORKSPACE!r}")
    events.append(_base(UserRemoved, cmd, user=_member(cmd)))


# Looked up by the command's exact type, once per command. Any other command is a write (`_write`),
# applied by its entry in `_WRITES`.
_COMMANDS: dict[type, Handler] = {
    ConfigureAgent: _configure,
    TurnOutcome: _turn_outcome,
    ExpireTurns: _expire,
    GrantConsent: _consent,
    WithdrawConsent: _consent,
    EraseSubject: _erase,
    RemoveAgent: _remove_agent,
    RemoveUser: _remove_user,
}
_WRITES: dict[type, Handler] = {
    AddMemory: _add,
    DeleteMemory: _delete,
    PinMemory: _pin,
    UnpinMemory: _pin,
    EditMemory: _edit,
    SweepExpired: _sweep,
    CurateBlock: _curate,
    ReportOutcome: _report,
}


# --------------------------------------------------------------------------- evolve


def evolve(state: LedgerState, event: Any) -> None:
    """Folds `event`: a contract event, or the `LedgerView` of one (recovery). Both carry the
    event's type name, so one table serves both; an event that changes no state has no entry."""
    fold = _FOLDS.get(event.type)
    if fold is not None:
        fold(state, agent_key(event.tenant, event.agent), event)


def _configured(state: LedgerState, ak: str, event: Any) -> None:
    lean = isinstance(event, LedgerView)
    state.configs[ak] = AgentConfig.model_validate_json(bytes(event.config_json)) if lean else event.config


def _block_changed(state: LedgerState, ak: str, event: Any) -> None:
    blocks = {k: v for k, v in (state.blocks.get(ak) or {}).items() if k != event.label}
    if event.text:
        blocks[event.label] = event.text
    state.blocks[ak] = blocks


def _turn_resolved(state: LedgerState, ak: str, event: Any) -> None:
    outcome = "committed" if event.committed else "timed_out" if event.timed_out else "rolled_back"
    key = f"{ak}|{event.turn_ref}"
    if state.turns_since is None:
        state.turns_since = event.occurred_at
    elif event.occurred_at - state.turns_since >= TURN_MEMORY:
        state.turns_before, state.turns, state.turns_since = state.turns, {}, event.occurred_at
    state.turns[key] = outcome
    state.staged.pop(key, None)
    rest = {k: at for k, at in (state.open_turns.get(ak) or {}).items() if k != key}
    if rest:
        state.open_turns[ak] = rest
    else:
        state.open_turns.pop(ak, None)


def _write_staged(state: LedgerState, ak: str, event: Any) -> None:
    key = f"{ak}|{event.turn_ref}"
    state.staged[key] = [*(state.staged.get(key) or []), event.command]
    opened = state.open_turns.get(ak) or {}
    if key not in opened:  # a WriteStaged's time is its write's `issued_at`
        state.open_turns[ak] = {**opened, key: event.occurred_at}


def _record_changed(state: LedgerState, ak: str, event: Any) -> None:
    if isinstance(event, LedgerView):
        raw = bytes(event.record_json)
        _store(state, ak, decode_lean_record(raw), raw)
    else:
        _store(state, ak, event.record, event.record.model_dump_json().encode())


_FOLDS: dict[str, Callable[[LedgerState, str, Any], None]] = {
    "AgentConfigured": _configured,
    "BlockChanged": _block_changed,
    "TurnResolved": _turn_resolved,
    "WriteStaged": _write_staged,
    **dict.fromkeys(RECORD_EVENT_TYPES, _record_changed),
    **subjects.FOLDS,
}


def _last_episode(state: LedgerState, ak: str, rec: MemoryRecord) -> str | None:
    """The newest episode a turn writing `rec` could read: of its own scope, or, for a
    session's, of the agent scope too."""
    slots = [dup_scope(rec)] + ([slot(Scope.AGENT, "", rec.preview)] if rec.scope is Scope.SESSION else [])
    found = [r for s in slots if (rid := state.index.get(f"{ak}|episode:{s}")) and (r := get_record(state, ak, rid))]
    return max(found, key=lambda r: (r.created, r.id)).id if found else None


def _counts_as_fact(r: MemoryRecord | LeanRecord) -> bool:
    """The live-fact cap counts facts only: episodes and procedures are not facts."""
    return r.status in LIVE and r.kind not in RESERVED_KINDS


def _count(state: LedgerState, key: str, live: int, pinned_chars: int) -> None:
    """Moves the live facts and pinned characters counted under `key` (`count_key`)."""
    stats = state.stats.get(key) or {"live": 0, "pinned_chars": 0}
    state.stats[key] = {"live": stats["live"] + live, "pinned_chars": stats["pinned_chars"] + pinned_chars}


def _store(state: LedgerState, ak: str, r: MemoryRecord | LeanRecord, raw: bytes) -> None:
    """`raw` is `r` as JSON, as the state keeps it."""
    key = f"{ak}/{r.id}"
    stored = state.records.get(key)
    prev = decode_lean_record(stored) if stored is not None else None
    if prev and prev.version >= r.version:
        return
    if prev:
        _count(state, count_key(ak, prev), -_counts_as_fact(prev), -(pin_line_chars(prev) if prev.pinned else 0))
    _count(state, count_key(ak, r), _counts_as_fact(r), pin_line_chars(r) if r.pinned else 0)
    subjects.track(state, ak, r)
    state.records[key] = raw
    text_key = f"{ak}|text:{dup_scope(r)}:{normalized_hash(r.summary, r.content)}"
    key_key = f"{ak}|key:{key_entry(dup_scope(r), r.kind, r.key)}" if r.key else None
    if r.kind == "episode" and r.version == 1:
        state.index[f"{ak}|episode:{dup_scope(r)}"] = r.id  # episodes come in log order: the last is the newest
    if r.status in LIVE:
        state.index.setdefault(text_key, r.id)
        if key_key and r.status is Status.ACTIVE:
            state.index.setdefault(key_key, r.id)
    else:
        # Tombstones and superseded versions do not hold a uniqueness slot.
        if state.index.get(text_key) == r.id:
            del state.index[text_key]
        if key_key and state.index.get(key_key) == r.id:
            del state.index[key_key]
