"""Planning an undo: which records a command, a turn or a session changed, the version each stood
at before, and the later writes of others that depend on what would be undone.

A record's versions each name the command that made them. The plan puts each record the target
touched back to its version before the target's first change of it (a record the target created
is tombstoned). A version made after that by another command depends on the undone one: the plan
lists it, and the undo stops unless the operator goes on (`force`), taking that change back too.
Text is never changed in place (new text makes a successor record), so a record goes back by its
status, pin, expiry and end of validity alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from events.commands import UndoChange
from events.record import MemoryRecord, Status


@dataclass(frozen=True)
class Version:
    """One version of a record, and the command that made it."""

    command_id: str
    record: MemoryRecord


@dataclass(frozen=True)
class Dependent:
    """A later write, by another command, to a record the undo puts back."""

    record_id: str
    version: int
    command_id: str

    def __str__(self) -> str:
        return f"record {self.record_id} version {self.version} (command {self.command_id})"


@dataclass
class Plan:
    changes: list[UndoChange] = field(default_factory=list)
    dependents: list[Dependent] = field(default_factory=list)
    touched: int = 0  # records the target changed
    unchanged: int = 0  # of those, the ones already as they were before it


def matcher(target: str, ref: str) -> Callable[[Version], bool]:
    """Which versions the target made: its command's, a turn's (`session/turn`) or a session's."""
    if target == "command":
        return lambda v: v.command_id == ref
    if target == "session":
        return lambda v: v.record.provenance.session == ref
    session, _, turn = ref.rpartition("/")
    if not session or not turn.isdigit():
        raise ValueError("turn: name it as <session>/<turn number>, e.g. s1/4")
    return lambda v: v.record.provenance.session == session and v.record.provenance.turn == int(turn)


def plan(records: Iterable[list[Version]], made_by: Callable[[Version], bool]) -> Plan:
    """`records`: each record's versions, any order."""
    out = Plan()
    for versions in records:
        versions = sorted(versions, key=lambda v: v.record.version)
        mine = [i for i, v in enumerate(versions) if made_by(v)]
        if not mine:
            continue
        out.touched += 1
        first, current = mine[0], versions[-1].record
        out.dependents += [Dependent(v.record.id, v.record.version, v.command_id)
                           for v in versions[first:] if not made_by(v)]
        before = versions[first - 1].record if first > 0 else None
        if before is None:
            status, pinned, expires_at, valid_to = Status.DELETED, False, current.expires_at, current.valid_to
        else:
            status, pinned, expires_at, valid_to = before.status, before.pinned, before.expires_at, before.valid_to
        if (current.status, current.pinned, current.expires_at, current.valid_to) == (status, pinned, expires_at,
                                                                                      valid_to):
            out.unchanged += 1  # nothing to write (an undo run again, a change of counts alone)
            continue
        out.changes.append(UndoChange(record_id=current.id, expected_version=current.version, status=status,
                                      pinned=pinned, expires_at=expires_at, valid_to=valid_to))
    return out

