"""Changes to a record already there: an edit (a successor, made by `records.decide_add`), a
delete (a tombstone), a pin or an unpin, a procedure's outcome, the expiry sweep.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from events.commands import AddMemory, DeleteMemory, EditMemory, PinMemory, ReportOutcome, SweepExpired, UnpinMemory
from events.errors import ErrorCode
from events.limits import STORED
from events.memory import RecordAdded, RecordDeleted, RecordExpired, RecordPinned, RecordRevised, RecordUnpinned
from events.record import LIVE, MemoryRecord, Source, Status
from events.rules.ledger import subject_rules as subjects
from events.rules.ledger.records import addressed_record, check_pin_budget, decide_add
from events.rules.ledger.state import LedgerState, Rejected, config_of, event_base, get_record, record_id_for
from events.rules.ledger.subject_rules import count_key
from events.rules.ledger.usage import check_expected


def decide_edit(state: LedgerState, ak: str, cmd: EditMemory, events: list) -> None:
    """An operator's edit, or a member's of their own fact, bypasses the write-time filter;
    the same text changes nothing (a PENDING or CONFLICT record stays out of the prompt); new
    text makes a successor, in the same scope, and needs the member's consent."""
    old = addressed_record(state, ak, cmd, cmd.record_id)
    check_expected(old, cmd)
    if old.status not in LIVE:
        raise Rejected(ErrorCode.NOT_LIVE, "record_id",
                       f"record {old.id} is {old.status.value}; only a live record can be edited")
    summary = old.summary if cmd.summary is None else cmd.summary
    content = old.content if cmd.content is None else cmd.content
    metadata = old.metadata if cmd.metadata is None else cmd.metadata
    if (summary, content, metadata) == (old.summary, old.content, old.metadata):
        events.append(event_base(RecordAdded, cmd, record=old, merged=True))
        return
    if why := subjects.consent_refusal(state, ak, cmd, config_of(state, ak)):
        raise Rejected(*why)
    # Validated where each part entered: an old summary kept whole, before summaries were one line, still edits.
    successor = AddMemory.model_validate(dict(
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
        tags=old.tags,
        classification=old.classification,
        scope=old.scope,
        session=old.session,
        user=old.user,
        pinned=old.pinned,
        replaces=old.id,
        key=old.key,
        confidence=old.confidence,
        importance=old.importance,
        expires_at=old.expires_at,
        observed_at=old.observed_at,
        valid_from=old.valid_from,
        valid_to=old.valid_to,
    ), context=STORED)
    decide_add(state, ak, successor, events, operator=True)


def decide_report(state: LedgerState, ak: str, cmd: ReportOutcome, events: list) -> None:
    """Each procedure counts its validations, successes and failures."""
    r = addressed_record(state, ak, cmd, cmd.record_id)
    check_expected(r, cmd)
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
        update={"version": r.version + 1, "metadata": m, "modified": cmd.issued_at, "provenance": cmd.provenance,
                "utility": learned_utility(int(m.get("successes", 0)), int(m.get("failures", 0)))}
    )
    events.append(event_base(RecordRevised, cmd, record=revised))


def learned_utility(successes: int, failures: int) -> float:
    """The mean of a Beta(1 + successes, 1 + failures): 0.5 with no outcome yet, moving toward
    the observed success rate as outcomes come, never all the way to 0 or 1 on a few."""
    return (successes + 1) / (successes + failures + 2)


def decide_sweep(state: LedgerState, ak: str, cmd: SweepExpired, events: list) -> None:
    """Tombstone the named live records past `expires_at`, as of the command's own time."""
    for rid in dict.fromkeys(cmd.record_ids):
        r = get_record(state, ak, rid)
        if r is None or r.status not in LIVE or r.expires_at is None or r.expires_at > cmd.issued_at:
            continue
        events.append(event_base(RecordExpired, cmd, record=tombstone_record(r, cmd, valid_to=r.expires_at)))


def decide_delete(state: LedgerState, ak: str, cmd: DeleteMemory, events: list) -> None:
    r = addressed_record(state, ak, cmd, cmd.record_id)
    check_expected(r, cmd)
    write = config_of(state, ak).memory.scope.write
    # A member deletes their own facts whatever the agent may write now.
    if cmd.provenance.source is not Source.MEMBER and r.scope.value.lower() not in write:
        raise Rejected(ErrorCode.SCOPE_NOT_ALLOWED, "record_id",
                       f"{r.scope.value} records are outside memory.scope.write {write}")
    if r.status is Status.DELETED:
        events.append(event_base(RecordDeleted, cmd, record=r))  # unchanged
        return
    if cmd.preview and not r.preview:
        tomb = _new_preview_tombstone(r, cmd)
        events.append(event_base(RecordDeleted, cmd, record=tomb))
        return
    events.append(event_base(RecordDeleted, cmd, record=tombstone_record(r, cmd, valid_to=cmd.issued_at)))


def tombstone_record(r: MemoryRecord, cmd: Any, valid_to: datetime) -> MemoryRecord:
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


def decide_pin(state: LedgerState, ak: str, cmd: PinMemory | UnpinMemory, events: list) -> None:
    r = addressed_record(state, ak, cmd, cmd.record_id)
    check_expected(r, cmd)
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
        events.append(event_base(RecordPinned if want else RecordUnpinned, cmd, record=r))
        return
    if want:
        check_pin_budget(state, ak, r, state.stats.get(count_key(ak, r)) or {"live": 0, "pinned_chars": 0})
    changed = r.model_copy(
        update={"version": r.version + 1, "pinned": want, "modified": cmd.issued_at, "provenance": cmd.provenance}
    )
    events.append(event_base(RecordPinned if want else RecordUnpinned, cmd, record=changed))
