"""Trust inputs the ledger keeps beside a record's content: how often it reached the model
(`RecordUsage`, folded as `UsageRecorded`), and the version check of every write that names
the version it read (`expected_version`, docs/features/trust.md).

Usage is not content: counting a retrieval makes no new version, so a retrieval never turns
a writer's `expected_version` stale, the history lists only changes of what the record says,
and no projection re-embeds or re-lists anything. The count rides along in the record as the
ledger keeps it, so the next real version carries it.
"""

from __future__ import annotations

from typing import Any

from events.commands import RecordUsage
from events.errors import ErrorCode
from events.memory import UsageRecorded
from events.record import MemoryRecord
from events.rules.ledger.state import LedgerState, Rejected, event_base, get_record


def check_expected(r: MemoryRecord, cmd: Any, field: str = "expected_version") -> None:
    """Refuses `cmd` when it names a version of `r` other than the current one (None: no check)."""
    want = getattr(cmd, "expected_version", None)
    if want is not None and want != r.version:
        raise Rejected(ErrorCode.VERSION_CONFLICT, field,
                       f"expected version {want} but the record is at version {r.version}; read it again and retry")


def check_new(cmd: Any, existing: MemoryRecord | None) -> None:
    """An `AddMemory` without `replaces` may name version 0 only: it must make a new record. One
    that would merge into a live record stating the same (`existing`) is refused, naming it."""
    want = getattr(cmd, "expected_version", None)
    if want is None:
        return
    if want != 0:
        raise Rejected(ErrorCode.VALIDATION_FAILED, "expected_version",
                       f"expected_version {want} needs replaces: a new record has no version yet, so only 0 "
                       "(must create) is allowed without it")
    if existing is not None:
        raise Rejected(ErrorCode.VERSION_CONFLICT, "expected_version",
                       f"expected version 0 (a new record) but record {existing.id} states the same and is at "
                       f"version {existing.version}; read it again and retry")


def mark_key(ak: str, partition: int) -> str:
    return f"{ak}|{partition}"


def decide_record_usage(state: LedgerState, ak: str, cmd: RecordUsage, events: list) -> None:
    """Counts a span of `memlane.usage` once: a span at or before the agent's mark for that
    partition was counted already (a redelivery, or the same batch sent again after a crash),
    whatever its command id. Ids the agent does not hold (purged, or never its own) are skipped."""
    mark = state.usage_marks.get(mark_key(ak, cmd.usage_partition), -1)
    if cmd.from_offset <= mark:
        return
    totals = {}
    for rid, n in sorted(cmd.counts.items()):
        r = get_record(state, ak, rid)
        if r is not None:
            totals[rid] = r.usage_count + n
    events.append(event_base(UsageRecorded, cmd, totals=totals, usage_partition=cmd.usage_partition,
                        through_offset=cmd.through_offset))


def usage_recorded(state: LedgerState, ak: str, event: Any) -> None:
    """Folds `UsageRecorded` (or its `LedgerView`): the totals into the records as kept, at the
    same version, and the span's end as the partition's mark."""
    for rid, total in event.totals.items():
        key = f"{ak}/{rid}"
        raw = state.records.get(key)
        if raw is None:
            continue
        r = MemoryRecord.model_validate_json(raw)
        if total > r.usage_count:
            state.records[key] = r.model_copy(update={"usage_count": total}).model_dump_json().encode()
    mk = mark_key(ak, event.usage_partition)
    state.usage_marks[mk] = max(event.through_offset, state.usage_marks.get(mk, -1))
