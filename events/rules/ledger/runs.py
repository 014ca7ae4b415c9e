"""Session memory in the ledger: a write naming a run (`AddMemory.run`) becomes a run entry
(`RunEntryAdded`), also stored as a record when it names a scope; `SummarizeRun` records the
compression of a run's older entries (`RunSummarized`). The rules of time and size are
`events.rules.runs`; the state keeps per run its last write and its entries not yet summarized.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from events.commands import AddMemory, SummarizeRun
from events.errors import ErrorCode
from events.memory import RunEntryAdded, RunSummarized
from events.record import Source
from events.rules import runs as rules
from events.rules.ledger.records import decide_add
from events.rules.ledger.state import RESERVED_KINDS, LedgerState, Rejected, config_of, event_base

Pending = tuple[tuple[str, int], ...]


def run_of(run: str, user: str | None) -> str:
    """A run is one member's: the same run id under another member (or none) is another run,
    so no member's session memory reaches another's recall or summary."""
    return f"{user or ''}|{run}"


def current(state: LedgerState, ak: str, run: str, at: datetime) -> tuple[datetime | None, Pending]:
    """The run's last write and its entries not yet summarized as of `at`: none once expired."""
    last, pending = (state.runs.get(ak) or {}).get(run, (None, ()))
    if last is None or rules.expired(last, at):
        return None, ()
    return last, tuple((eid, n) for eid, n in pending)


def add_in_run(state: LedgerState, ak: str, cmd: AddMemory, events: list) -> None:
    """`AddMemory`: as before without a run; with one and no scope, a run entry only; with a
    run and a scope, the record as before and a run entry pointing at it."""
    if cmd.run is None:
        decide_add(state, ak, cmd, events)
        return
    rid = None
    if cmd.scope is not None:
        made: list[Any] = []
        decide_add(state, ak, cmd, made)
        events.extend(made)
        rid = next((e.record.id for e in made if e.type == "RecordAdded"), None)
    else:
        _check_entry(state, ak, cmd)
    last, pending = current(state, ak, run_of(cmd.run, cmd.user), cmd.issued_at)
    chars = rules.entry_chars(cmd.summary, cmd.content)
    events.append(event_base(
        RunEntryAdded, cmd, run=cmd.run, entry_id=rules.entry_id_for(cmd.tenant, cmd.agent, cmd.command_id),
        record_id=rid, summary=cmd.summary, content=cmd.content, kind=cmd.kind, user=cmd.user,
        run_last_write=max(last, cmd.issued_at) if last else cmd.issued_at, starts_run=last is None,
        pending_entries=len(pending) + 1, pending_chars=sum(n for _, n in pending) + chars,
    ))


def _check_entry(state: LedgerState, ak: str, cmd: AddMemory) -> None:
    """A run entry is held to a record's kind and memory rules, but needs no scope."""
    cfg = config_of(state, ak)
    if not cfg.memory.enabled:
        raise Rejected(ErrorCode.MEMORY_DISABLED, "memory.enabled", "memory is not enabled for this agent")
    if cmd.kind in RESERVED_KINDS and cmd.provenance.source is not Source.CONSOLIDATION:
        raise Rejected(ErrorCode.VALIDATION_FAILED, "kind", f"kind {cmd.kind!r} is reserved for consolidation")
    if cmd.kind not in RESERVED_KINDS and cmd.kind not in cfg.memory.kinds:
        raise Rejected(ErrorCode.VALIDATION_FAILED, "kind",
                       f"kind {cmd.kind!r} is not declared; declared kinds: {', '.join(cfg.memory.kinds)}")


def summarize(state: LedgerState, ak: str, cmd: SummarizeRun, events: list) -> None:
    """Only entries still waiting for a summary may be summarized: a compression built on a
    summary that has changed since (another took some of its entries) is refused, and the
    worker's next trigger compresses again from the newer summary."""
    last, pending = current(state, ak, run_of(cmd.run, cmd.user), cmd.issued_at)
    if last is None:
        raise Rejected(ErrorCode.NOT_FOUND, "run", f"run {cmd.run} has no live session memory")
    waiting = {eid for eid, _ in pending}
    if missing := [eid for eid in cmd.entry_ids if eid not in waiting]:
        raise Rejected(ErrorCode.VERSION_CONFLICT, "entry_ids",
                       f"{len(missing)} of the entries are not waiting for a summary (e.g. {missing[0]})")
    events.append(event_base(RunSummarized, cmd, run=cmd.run, user=cmd.user, summary=cmd.summary, entry_ids=list(cmd.entry_ids),
                         run_last_write=last))


def _live_runs(state: LedgerState, ak: str, at: datetime) -> dict[str, tuple[datetime, Pending]]:
    runs: Mapping[str, Any] = state.runs.get(ak) or {}
    return {run: (last, tuple(p)) for run, (last, p) in runs.items() if not rules.expired(last, at)}


def entry_added(state: LedgerState, ak: str, event: Any) -> None:
    """Folds a `RunEntryAdded` (or its `LedgerView`): the agent's expired runs leave the state."""
    runs = _live_runs(state, ak, event.occurred_at)
    run = run_of(event.run, event.user)
    _, pending = runs.get(run, (None, ()))
    chars = rules.entry_chars(event.summary, event.content)
    runs[run] = (event.run_last_write, (*pending, (event.entry_id, chars)))
    state.runs[ak] = runs


def summarized(state: LedgerState, ak: str, event: Any) -> None:
    runs, run = dict(state.runs.get(ak) or {}), run_of(event.run, event.user)
    if run not in runs:
        return
    last, pending = runs[run]
    gone = set(event.entry_ids)
    runs[run] = (last, tuple(p for p in pending if p[0] not in gone))
    state.runs[ak] = runs


FOLDS = {"RunEntryAdded": entry_added, "RunSummarized": summarized}
