"""`decide`: the events a command produces. A handler per command type (`_COMMANDS`, and
`_WRITES` for the writes), the turn a write belongs to (staged while it is open, applied
once it commits, discarded if it does not or never answers: `overdue`, `_expire_turns`),
and the ledger's answers in place of events (`refused`, `reused`, `oversized`).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from events.base import command_key
from events.codec import PLAIN, Codec
from events.commands import (
    AddMemory,
    ConfigureAgent,
    CurateBlock,
    DeleteMemory,
    EditMemory,
    EraseSubject,
    ExpireTurns,
    GrantConsent,
    PinMemory,
    PurgeRecords,
    RecordUsage,
    RemoveAgent,
    RemoveTenant,
    RemoveUser,
    ReportOutcome,
    RestoreTenant,
    RestoreUser,
    SummarizeRun,
    SweepExpired,
    TurnOutcome,
    UndoWrites,
    UnpinMemory,
    WithdrawConsent,
)
from events.errors import ErrorCode
from events.limits import EVENT_LIMIT, largest_field, too_large
from events.memory import CommandRejected, TurnResolved, WriteDiscarded, WriteStaged
from events.record import Provenance, Source
from events.rules.ledger import notes as notes_rules
from events.rules.ledger import profiles, retention, tenant
from events.rules.ledger import subject_rules as subjects
from events.rules.ledger.agent import decide_configure, decide_curate
from events.rules.ledger.changes import decide_delete, decide_edit, decide_pin, decide_report, decide_sweep
from events.rules.ledger.erasure import decide_remove_tenant
from events.rules.ledger.fold import evolve
from events.rules.ledger.records import members_stay_members, new_record
from events.rules.ledger.runs import add_in_run, summarize
from events.rules.ledger.state import (
    NAMESPACE,
    TURN_TIMEOUT,
    LedgerState,
    Rejected,
    agent_key,
    config_of,
    event_base,
    event_id,
    outcome_of,
    rejected_event,
    scratch_state,
)
from events.rules.ledger.subject_commands import (
    decide_consent,
    decide_erase,
    decide_remove_agent,
    decide_remove_user,
    decide_restore_tenant,
    decide_restore_user,
)
from events.rules.ledger.undo import decide_undo
from events.rules.ledger.usage import decide_record_usage
from events.sealing import KeyDestroyed


def decide(state: LedgerState, cmd: Any, turn_timeout: timedelta = TURN_TIMEOUT, codec: Codec = PLAIN) -> list[Any]:
    """The events `cmd` produces. Event ids are the command's key plus a position. Writes
    staged on a turn whose first write is `turn_timeout` older than `cmd` are discarded first.
    `codec` stages a turn's writes and opens them again, as the ledger's state keeps them."""
    ak = agent_key(cmd.tenant, cmd.agent)
    expired = _expire_turns(state, ak, cmd, turn_timeout, codec)
    if expired:
        state = scratch_state(state)
        for e in expired:
            evolve(state, e)
    events = expired + _decide(state, ak, cmd, codec)
    n = len(events)
    return [
        e.model_copy(update={"event_id": event_id(cmd.tenant, cmd.agent, cmd.command_id, i), "last": i == n - 1}) for i, e in enumerate(events)
    ]


def refused(cmd: Any, code: ErrorCode, field: str | None, reason: str) -> list[CommandRejected]:
    """What the ledger emits in place of events it cannot write (one over the message limit,
    or a command its rules failed on): the caller gets an answer, and the partition moves on."""
    e = rejected_event(cmd, Rejected(code, field, reason))
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
    e = rejected_event(cmd, Rejected(ErrorCode.DUPLICATE_ID, "command_id",
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


def _expire_turns(state: LedgerState, ak: str, cmd: Any, turn_timeout: timedelta, codec: Codec) -> list[Any]:
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
        writes = _staged(state, key, codec)
        out.append(event_base(TurnResolved, cmd, turn_ref=ref, committed=False, timed_out=True))
        reason = f"turn timed out: no outcome within {int(turn_timeout.total_seconds())} s"
        out.extend(event_base(WriteDiscarded, w, turn_ref=ref, reason=reason) for w in writes)
    return out


# A command handler appends the command's events to `events`, or raises `Rejected`.
Handler = Callable[[LedgerState, str, Any, list], None]


def _decide(state: LedgerState, ak: str, cmd: Any, codec: Codec) -> list[Any]:
    events: list[Any] = []
    try:
        _admit(state, ak, cmd)
        handler = _COMMANDS.get(type(cmd))
        if handler is not None:
            handler(state, ak, cmd, events)
        elif isinstance(cmd, TurnOutcome):
            _turn_outcome(state, ak, cmd, events, codec)
        else:
            _write(state, ak, cmd, events, codec)
    except Rejected as r:
        events = [rejected_event(cmd, r)]
    return events


def _admit(state: LedgerState, ak: str, cmd: Any) -> None:
    """Refuses a command its agent or subject may not give now (`subject_rules.admission`).
    Asked before any command is decided (a write is refused before it is staged) and again as
    each staged write is applied, so nothing is written after a removal's or a withdrawal's event."""
    why = subjects.admission(state, ak, cmd, config_of(state, ak))
    if why is not None:
        raise Rejected(*why)


def _write(state: LedgerState, ak: str, cmd: Any, events: list, codec: Codec) -> None:
    """A write (any command but the turn and configuration ones): staged while its turn is
    open, applied once the turn committed, discarded if it did not."""
    if not cmd.turn_ref:
        _apply_write(state, ak, cmd, events)
        return
    outcome = outcome_of(state, f"{ak}|{cmd.turn_ref}")
    if outcome is None:
        _validate_write(state, ak, cmd)
        events.append(event_base(WriteStaged, cmd, turn_ref=cmd.turn_ref, command=codec.encode(cmd).decode()))
    elif outcome == "committed":
        _apply_write(state, ak, cmd, events)
    else:
        events.append(event_base(WriteDiscarded, cmd, turn_ref=cmd.turn_ref, reason=f"turn {outcome}"))


def _expire(state: LedgerState, ak: str, cmd: ExpireTurns, events: list) -> None:
    """Nothing of its own: `decide` expires every overdue turn of the agent before any command."""


def _turn_outcome(state: LedgerState, ak: str, cmd: TurnOutcome, events: list, codec: Codec) -> None:
    ref = f"{ak}|{cmd.turn_ref}"
    if outcome_of(state, ref) is not None:
        return  # already resolved: a forwarded outcome seen twice changes nothing
    events.append(event_base(TurnResolved, cmd, turn_ref=cmd.turn_ref, committed=cmd.committed))
    # Apply staged writes against a scratch copy, so later writes of the turn see earlier ones
    # without this function touching the real state (evolve does that, from the events).
    scratch = scratch_state(state)
    for staged in _staged(state, ref, codec):
        write = _in_turn(staged, cmd.provenance)
        if not cmd.committed:
            reason = cmd.reason or "turn rolled back"
            events.append(event_base(WriteDiscarded, write, turn_ref=cmd.turn_ref, reason=reason))
            continue
        sub: list[Any] = []
        try:
            _admit(scratch, ak, write)  # a removal or a withdrawal since it was staged refuses it
            _apply_write(scratch, ak, write, sub)
        except Rejected as r:
            sub = [rejected_event(write, r)]
        for e in sub:
            evolve(scratch, e)
        events.extend(sub)


def _staged(state: LedgerState, key: str, codec: Codec) -> list[Any]:
    """The writes staged on turn `key`. One sealed under a destroyed key (its member was erased
    on another partition) is gone, as if discarded; `KeyMissing` goes up to the worker, which
    catches up on the keys and decides again."""
    writes = []
    for raw in state.staged.get(key) or []:
        try:
            writes.append(codec.decode_stored("memlane.memory.commands", raw))
        except KeyDestroyed:
            continue
    return writes


def _in_turn(write: Any, turn: Provenance) -> Any:
    """A write made during a turn names that turn (each record names the execution,
    invocation, agent version and session that wrote it). A call over HTTP knows only its
    turn reference; the turn's outcome carries the rest, and fills what the write left out."""
    known = write.provenance.model_dump(exclude_none=True)
    fill = {k: getattr(turn, k) for k in ("execution_id", "invocation", "agent_version", "session", "turn")
            if k not in known and getattr(turn, k) is not None}
    return write.model_copy(update={"provenance": write.provenance.model_copy(update=fill)}) if fill else write


def _validate_write(state: LedgerState, ak: str, cmd: Any) -> None:
    """The rules a write is held to before it is staged: only a new record's (raises `Rejected`)."""
    if type(cmd) is AddMemory and (cmd.run is None or cmd.scope is not None):  # a run entry only: no record
        new_record(state, ak, members_stay_members(state, ak, cmd))


def _apply_write(state: LedgerState, ak: str, cmd: Any, events: list) -> None:
    handler = _WRITES.get(type(cmd))
    if handler is not None:
        handler(state, ak, cmd, events)


# Looked up by the command's exact type, once per command. A turn's outcome applies its staged
# writes (`_turn_outcome`); any other command is a write (`_write`), applied by its entry in `_WRITES`.
_COMMANDS: dict[type, Handler] = {
    ConfigureAgent: decide_configure,
    ExpireTurns: _expire,
    GrantConsent: decide_consent,
    WithdrawConsent: decide_consent,
    EraseSubject: decide_erase,
    RemoveAgent: decide_remove_agent,
    RemoveUser: decide_remove_user,
    RemoveTenant: decide_remove_tenant,
    RestoreUser: decide_restore_user,
    RestoreTenant: decide_restore_tenant,
    SummarizeRun: summarize,
    # An operator's undo: its plan names each record and the version it saw; never staged.
    UndoWrites: decide_undo,
    # Not a write: usage is the trust worker's count, with no turn and no new version.
    RecordUsage: decide_record_usage,
    # Notes: the agent's own, applied at once, never staged on a turn: they cite committed messages (docs/features/notes.md).
    **notes_rules.HANDLERS,
    # A member's profile: applied at once, never staged on a turn (docs/features/profiles.md).
    **profiles.HANDLERS,
    # Tenant and platform memory: an administrator's act or the conventions worker's, never staged.
    **tenant.HANDLERS,
}


_WRITES: dict[type, Handler] = {
    AddMemory: add_in_run,
    DeleteMemory: decide_delete,
    PinMemory: decide_pin,
    UnpinMemory: decide_pin,
    EditMemory: decide_edit,
    SweepExpired: decide_sweep,
    PurgeRecords: retention._purge,
    CurateBlock: decide_curate,
    ReportOutcome: decide_report,
}
