"""New records, and the records a command may address: the scope a write takes, the
record an `AddMemory` makes and its checks (`decide_add`: a restatement merged, a replaced record
superseded, a keyed fact in conflict, the live-fact cap, the pinned budget), which records a
command reaches (`_visible`, `addressed_record`), and the episode a new episode links.
"""

from __future__ import annotations

from typing import Any

from events.commands import AddMemory, MergeEvidence
from events.config import MEMBER_FACT_CHARS, AgentConfig
from events.errors import ErrorCode
from events.memory import RecordAdded, RecordSuperseded
from events.record import LIVE, MemoryRecord, Scope, Source, Status
from events.rules import near_duplicate
from events.rules.ledger import episodes
from events.rules.ledger import subject_rules as subjects
from events.rules.ledger.state import (
    LIVE_FACT_CAP,
    RESERVED_KINDS,
    LedgerState,
    Rejected,
    config_of,
    event_base,
    expiry_of,
    get_record,
    normalized_hash,
    record_id_for,
)
from events.rules.ledger.subject_rules import count_key, dup_scope, key_entry, key_slots_seen, slot, text_entry
from events.rules.ledger.usage import check_expected, check_new
from events.rules.tokens import CHARS_PER_TOKEN, pin_budget_chars, pin_line_chars
from events.rules.visibility import default_scope


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


def new_record(state: LedgerState, ak: str, cmd: AddMemory, operator: bool = False) -> MemoryRecord:
    cfg = config_of(state, ak)
    if not cfg.memory.enabled:
        raise Rejected(ErrorCode.MEMORY_DISABLED, "memory.enabled", "memory is not enabled for this agent")
    if cmd.kind in RESERVED_KINDS:
        # Episodes and procedures are what consolidation makes of sessions (docs/features/consolidation.md).
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
    limit, setting = cfg.memory.fact_chars, "memory.fact_chars"
    if scope is Scope.USER and (limit is None or limit > MEMBER_FACT_CHARS):
        limit, setting = MEMBER_FACT_CHARS, "a member's fact"  # whatever the agent's own setting
    size = len(cmd.summary) + len(cmd.content)
    if limit is not None and size > limit and cmd.kind not in RESERVED_KINDS:
        # Episodes and procedures are not facts: they retell a session, and the cap counts facts only.
        raise Rejected(ErrorCode.LIMIT_EXCEEDED, "content",
                       f"the fact holds {size} characters (summary and content), over {setting}={limit}; "
                       "shorten it or split it into several facts")
    if cmd.pinned and cfg.memory.pinned is None:
        raise Rejected(ErrorCode.PIN_NOT_ENABLED, "pinned", "pinning is off: memory.pinned is not configured")
    expires = expiry_of(cfg, scope, cmd.issued_at, cmd.expires_at)
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
        tags=cmd.tags,
        classification=cmd.classification,
        key=cmd.key,
        confidence=cmd.confidence,
        **({"importance": cmd.importance} if cmd.importance is not None else {}),
        expires_at=expires,
        status=Status.ACTIVE,
        pinned=cmd.pinned,
        replaces=cmd.replaces,
        preview=cmd.preview,
        provenance=p,
        observed_at=cmd.observed_at or cmd.issued_at,
        valid_from=cmd.valid_from or min(cmd.observed_at or cmd.issued_at, cmd.valid_to or cmd.issued_at),
        valid_to=cmd.valid_to,
        recorded_at=cmd.issued_at,
    )


def _visible(r: MemoryRecord, cmd: Any) -> bool:
    """A command addresses a record only within its own session and preview rules.

    A SESSION record never reaches another session, and an agent without a
    session has no session scope, so an agent's command without a session reaches no
    SESSION record. An operator's reaches every session (`deleteAgentMemory` deletes any
    of the agent's records). A USER record is its member's (`subject_rules.may_address`)."""
    if not subjects.may_address(r, cmd):
        return False
    if r.scope is Scope.SESSION and cmd.provenance.source is not Source.OPERATOR and getattr(cmd, "session", None) != r.session:
        return False
    if r.preview and not cmd.preview:
        return False
    return True


def addressed_record(state: LedgerState, ak: str, cmd: Any, rid: str, field: str = "record_id") -> MemoryRecord:
    """The record `cmd` names in `field`, if it exists and `cmd` may address it (`_visible`);
    else the same NOT_FOUND either way, so a command learns nothing of records it cannot see."""
    r = get_record(state, ak, rid)
    if r is None or not _visible(r, cmd):
        raise Rejected(ErrorCode.NOT_FOUND, field, f"record {rid} does not exist for this agent")
    return r


def members_stay_members(state: LedgerState, ak: str, cmd: AddMemory) -> AddMemory:
    """A replacement of a member's fact (a USER record) is the member's too: scope USER and the
    old record's user, whatever scope the write defaulted to, so a replacement never moves a
    member's fact into session or agent scope. One that asks for another scope is refused.
    A record the write may not address is left to `addressed_record` (the same NOT_FOUND as ever)."""
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


def decide_add(state: LedgerState, ak: str, cmd: AddMemory, events: list, operator: bool = False) -> None:
    """Appends an `AddMemory`'s events to `events`: a new record (and its predecessor superseded
    when it replaces one), or a confirmation of the live record it restates."""
    if not operator:  # an operator's edit makes its successor in the old record's scope already
        cmd = members_stay_members(state, ak, cmd)
    rec = new_record(state, ak, cmd, operator)
    if not cmd.replaces:
        check_new(cmd, get_record(state, ak, rec.id))  # an id taken: a conflict for a "must create" write
    if get_record(state, ak, rec.id):
        raise Rejected(ErrorCode.DUPLICATE_ID, "record_id", f"record {rec.id} already exists")
    stats = state.stats.get(count_key(ak, rec)) or {"live": 0, "pinned_chars": 0}
    h = normalized_hash(cmd.summary, cmd.content)
    if _restated(state, ak, cmd, rec, h, events, operator):
        return
    old: MemoryRecord | None = None
    if cmd.replaces:
        old = _replaceable(state, ak, cmd, cmd.replaces)
        # Labels stay once declared: the successor keeps the old values it does not override.
        rec = rec.model_copy(update={"labels": {**old.labels, **rec.labels}})
    if rec.key and not old:
        holder_rec = _key_holder(state, ak, rec)
        if holder_rec and holder_rec.status in LIVE and normalized_hash(holder_rec.summary, holder_rec.content) == h:
            check_new(cmd, holder_rec)
            episodes.confirmed(state, ak, cmd, holder_rec, events)  # its key's fact, restated
            return
        rec = _keyed_status(cmd, rec, holder_rec)
    if cmd.contradicts and not old and rec.status is Status.ACTIVE:
        # The same for a disagreement the review names, keys or not.
        if addressed_record(state, ak, cmd, cmd.contradicts, "contradicts").status in LIVE:
            rec = rec.model_copy(update={"status": Status.CONFLICT})
    if rec.kind == "episode" and not old:
        # An episode links the previous one. Linked here, in log order, so two
        # sessions ending together cannot both claim the same predecessor, and a replay
        # links the same.
        rec = rec.model_copy(update={"metadata": {**rec.metadata, "previous_episode": _last_episode(state, ak, rec)}})
    _check_live_cap(rec, stats, old)
    if rec.pinned:
        check_pin_budget(state, ak, rec, stats, freed=pin_line_chars(old) if old and old.pinned else 0)
    if old and old.preview == rec.preview:
        events.append(_superseded(cmd, old, rec))
    # A preview write that names a live record shadows it and leaves it untouched.
    events.append(event_base(RecordAdded, cmd, record=rec))
    if rec.kind == "episode" and not old:
        episodes.link(state, ak, cmd, rec, events)  # the run's extraction-made facts name their episode


def _restated(state: LedgerState, ak: str, cmd: AddMemory, rec: MemoryRecord, h: str, events: list,
              operator: bool) -> bool:
    """Whether the write restates a live record, which it then confirms instead of adding `rec`:
    the same text (`h`) in the same slot, or a near duplicate the ledger's own check agrees on
    (`cmd.merge`, never an operator's). A write that replaces a record restates none."""
    same = state.index.get(f"{ak}|text:{text_entry(rec, h)}")
    if same and not cmd.replaces:
        existing = get_record(state, ak, same)
        if existing and existing.status in LIVE:
            check_new(cmd, existing)
            episodes.confirmed(state, ak, cmd, existing, events)  # a restatement from another run confirms it
            return True
    if cmd.merge is not None and not operator and (near := _near_duplicate(state, ak, cmd, rec)) is not None:
        survivor, evidence = near
        check_new(cmd, survivor)
        n = len(events)
        episodes.confirmed(state, ak, cmd, survivor, events)  # counted as a confirmation, as a restatement is
        events[n] = events[n].model_copy(update={"merge": evidence})
        return True
    return False


def _replaceable(state: LedgerState, ak: str, cmd: AddMemory, rid: str) -> MemoryRecord:
    """The record the write replaces (`rid`): one it may address, at the version it expects, and live."""
    old = addressed_record(state, ak, cmd, rid, "replaces")
    check_expected(old, cmd)
    if old.status not in LIVE:
        raise Rejected(
            ErrorCode.NOT_LIVE, "replaces",
            f"record {rid} is {old.status.value}; only a live record can be replaced",
        )
    return old


def _key_holder(state: LedgerState, ak: str, rec: MemoryRecord) -> MemoryRecord | None:
    """The record, whatever its status, that holds `rec`'s key in a slot the write sees."""
    holders = (state.index.get(f"{ak}|key:{key_entry(seen, rec.kind, rec.key)}") for seen in key_slots_seen(rec))
    return next((r for h in holders if h and (r := get_record(state, ak, h))), None)


def _keyed_status(cmd: AddMemory, rec: MemoryRecord, holder: MemoryRecord | None) -> MemoryRecord:
    """A new keyed fact whose key a live record holds with another text, or one of a batch
    that disagrees within itself (`cmd.pending`)."""
    if holder and holder.status in LIVE:
        # A disagreement with a stored fact is kept, as CONFLICT, and never injected.
        return rec.model_copy(update={"status": Status.CONFLICT})
    if cmd.pending:
        # ... and one within a batch, with no stored fact, as PENDING.
        return rec.model_copy(update={"status": Status.PENDING})
    return rec


def _check_live_cap(rec: MemoryRecord, stats: dict, old: MemoryRecord | None) -> None:
    """A new fact (no successor, no episode or procedure) must fit under the live-fact cap."""
    if not old and rec.kind not in RESERVED_KINDS and stats["live"] >= LIVE_FACT_CAP:
        # A member's facts are capped per member (`count_key`), the others per agent.
        n = stats["live"]
        holds = (f"the member holds {n} live facts on this agent" if rec.scope is Scope.USER
                 else f"the agent holds {n} live facts")
        raise Rejected(ErrorCode.LIMIT_EXCEEDED, "summary",
                       f"{holds}, the cap is {LIVE_FACT_CAP}; replace or delete facts first")


def _superseded(cmd: AddMemory, old: MemoryRecord, rec: MemoryRecord) -> RecordSuperseded:
    """The event that retires `old` for its successor `rec`."""
    superseded = old.model_copy(
        update={
            "version": old.version + 1,
            "status": Status.SUPERSEDED,
            "replaced_by": rec.id,
            "modified": cmd.issued_at,
            "superseded_at": cmd.issued_at,
            # It stopped holding when its successor started, unless it had ended before.
            "valid_to": min(old.valid_to, rec.valid_from) if old.valid_to else rec.valid_from,
            "pinned": False,
            "provenance": cmd.provenance,
        }
    )
    return event_base(RecordSuperseded, cmd, record=superseded)


def _near_duplicate(state: LedgerState, ak: str, cmd: AddMemory,
                    rec: MemoryRecord) -> tuple[MemoryRecord, MergeEvidence] | None:
    """The live record the API found `cmd` to restate (`cmd.merge`), and the evidence as checked
    here, if the ledger agrees: the record is still ACTIVE, one the write may address, of its
    scope, session or member, preview flag and kind, last changed within the window (by the
    ledger's own times), and the rule holds on the overlap and vetoes recomputed from both texts
    (the similarity is the API's, which has the embedder). Else None, and the write adds a record.
    A write naming `replaces`, a `key`, or `pinned` asks for a record of its own, and never merges."""
    ev = cmd.merge
    if ev is None or cmd.replaces or cmd.key or cmd.pinned:
        return None
    target = get_record(state, ak, ev.record_id)
    if (target is None or target.status is not Status.ACTIVE or not _visible(target, cmd)
            or dup_scope(target) != dup_scope(rec) or target.kind != rec.kind or target.key is not None):
        return None  # a keyed fact is unique per its key: a keyless write never merges into it
    age = cmd.issued_at - target.modified
    if not near_duplicate.decide(rec.text, target.text, ev.similarity, age):
        return None
    checked = ev.model_copy(update={"overlap": round(near_duplicate.word_overlap(rec.text, target.text), 6),
                                    "age_s": age.total_seconds()})
    return target, checked


def check_pin_budget(state: LedgerState, ak: str, rec: MemoryRecord, stats: dict, freed: int = 0) -> None:
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


def _last_episode(state: LedgerState, ak: str, rec: MemoryRecord) -> str | None:
    """The newest episode a turn writing `rec` could read: of its own scope, or, for a
    session's, of the agent scope too."""
    slots = [dup_scope(rec)] + ([slot(Scope.AGENT, "", rec.preview)] if rec.scope is Scope.SESSION else [])
    found = [r for s in slots if (rid := state.index.get(f"{ak}|episode:{s}")) and (r := get_record(state, ak, rid))]
    return max(found, key=lambda r: (r.created, r.id)).id if found else None
