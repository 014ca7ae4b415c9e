"""The ledger's side of an undo: each record the plan names gets a new version with the status,
pin and expiry it had before the undone writes, if it is still at the version the plan saw."""

from __future__ import annotations

from events.commands import UndoChange, UndoWrites
from events.errors import ErrorCode
from events.memory import RecordDeleted, RecordRestored
from events.record import LIVE, MemoryRecord, Source, Status
from events.rules.ledger.state import LedgerState, Rejected, event_base, get_record


def decide_undo(state: LedgerState, ak: str, cmd: UndoWrites, events: list) -> None:
    """All or nothing: one record that moved on since the plan refuses the whole undo, naming it,
    so the operator plans again against what is there now. Tombstones go first, so a restored
    keyed fact never meets the record that replaced it still live."""
    if cmd.provenance.source is not Source.OPERATOR:
        raise Rejected(ErrorCode.FORBIDDEN, None, "only an operator undoes writes")
    # Tombstones first; `i` stays the change's place in the command, which a refusal names.
    for i, c in sorted(enumerate(cmd.changes), key=lambda ic: ic[1].status is not Status.DELETED):
        r = get_record(state, ak, c.record_id)
        if r is None:
            raise Rejected(ErrorCode.NOT_FOUND, f"changes.{i}.record_id", f"record {c.record_id} does not exist "
                           "for this agent (purged or erased since): plan the undo again")
        if r.version != c.expected_version:
            raise Rejected(ErrorCode.VERSION_CONFLICT, f"changes.{i}.expected_version",
                           f"record {c.record_id} is at version {r.version}, not {c.expected_version}: it changed "
                           "since the undo was planned; plan it again")
        if (r.status, r.pinned, r.expires_at, r.valid_to) == (c.status, c.pinned, c.expires_at, c.valid_to):
            continue  # already as it was
        kind = RecordDeleted if c.status is Status.DELETED else RecordRestored
        events.append(event_base(kind, cmd, record=restored(r, c, cmd)))


def restored(r: MemoryRecord, c: UndoChange, cmd: UndoWrites) -> MemoryRecord:
    live = c.status in LIVE
    return r.model_copy(update={
        "version": r.version + 1,
        "status": c.status,
        "pinned": c.pinned and c.status is Status.ACTIVE,
        "expires_at": c.expires_at,
        "modified": cmd.issued_at,
        # Back among the live: no longer superseded by (or tombstoned for) what the undo took back.
        **({"replaced_by": None, "superseded_at": None, "valid_to": c.valid_to} if live else {}),
        "provenance": cmd.provenance,
    })
