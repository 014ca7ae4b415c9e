"""Retention: each night, live facts past their expiry and superseded rows past
the retention period become tombstones, and tombstones deleted at least the retention period
ago are purged for good. `due` picks a night's work from the ledger's state, capped per
subject (a busy subject waits for the next night); the ledger checks every id again when it
decides the commands, as of their own `issued_at`, so a replay decides the same.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from events.commands import PurgeRecords, SweepExpired
from events.lean import decode_lean_record
from events.memory import RecordDeleted, RecordsPurged
from events.record import LIVE, Provenance, Scope, Source, Status
from events.rules.ledger.changes import tombstone_record
from events.rules.ledger.state import NAMESPACE, LedgerState, event_base, get_record
from events.rules.ledger.subject_rules import count_key

RETENTION = timedelta(days=180)  # tombstones are physically deleted 180 days after deletion
NIGHTLY_CAP = 500  # records per subject per night
BATCH = 1000  # ids per command (the commands' own limit)


@dataclass
class Night:
    """A night's retention work: commands for the ledger's own input, and what waits."""

    commands: list[Any] = field(default_factory=list)
    expired: int = 0
    superseded: int = 0
    purged: int = 0
    deferred: int = 0  # records over their subject's cap, left for the next night


def _kind(r: Any, now: datetime, retention: timedelta) -> str | None:
    if r.status in LIVE:
        return "expired" if r.expires_at is not None and r.expires_at <= now else None
    if r.status is Status.SUPERSEDED:
        return "superseded" if r.superseded_at is not None and r.superseded_at <= now - retention else None
    if r.status is Status.DELETED:
        deleted = r.modified or r.created
        return "purged" if deleted <= now - retention else None
    return None


def due(state: LedgerState, now: datetime, retention: timedelta = RETENTION, cap: int = NIGHTLY_CAP,
        records: Iterable[tuple[str, bytes]] | None = None) -> Night:
    """The night's commands, as of `now`. Reads every record the state holds once."""
    night = Night()
    taken: dict[str, int] = {}
    work: dict[tuple[str, str], list[str]] = {}  # (agent key, "expire" | "purge") -> ids
    for key, raw in state.records.items() if records is None else records:
        r = decode_lean_record(raw)
        kind = _kind(r, now, retention)
        if kind is None:
            continue
        ak = key.rsplit("/", 1)[0]
        subject = count_key(ak, r)
        if taken.get(subject, 0) >= cap:
            night.deferred += 1
            continue
        taken[subject] = taken.get(subject, 0) + 1
        setattr(night, kind, getattr(night, kind) + 1)
        work.setdefault((ak, "expire" if kind == "expired" else "purge"), []).append(r.id)
    run = now.isoformat()  # one night's commands share it: a second run is new commands
    for (ak, what), ids in sorted(work.items()):
        tenant, agent = ak.split("/", 1)
        for i in range(0, len(ids), BATCH):
            chunk = sorted(ids)[i:i + BATCH]
            cls = SweepExpired if what == "expire" else PurgeRecords
            night.commands.append(cls(
                command_id=f"retention:{what}:{uuid.uuid5(NAMESPACE, f'{ak}|{run}|{i}')}",
                tenant=tenant, agent=agent, issued_at=now, record_ids=chunk,
                provenance=Provenance(source=Source.OPERATOR, modified_by="retention"),
            ))
    return night


def _purge(state: LedgerState, ak: str, cmd: PurgeRecords, events: list) -> None:
    """Superseded rows past the retention period become tombstones; tombstones deleted at least
    the retention period before the command's time are purged (one event per subject)."""
    purged: dict[str | None, list[str]] = {}
    for rid in dict.fromkeys(cmd.record_ids):
        r = get_record(state, ak, rid)
        if r is None:
            continue
        kind = _kind(r, cmd.issued_at, RETENTION)
        if kind == "superseded":
            events.append(event_base(RecordDeleted, cmd, record=tombstone_record(r, cmd, valid_to=r.superseded_at)))
        elif kind == "purged":
            purged.setdefault(r.user if r.scope is Scope.USER else None, []).append(rid)
    for user, ids in purged.items():
        events.append(event_base(RecordsPurged, cmd, record_ids=ids, user=user))


def _purged(state: LedgerState, ak: str, event: Any) -> None:
    """A purged tombstone is forgotten: it holds no uniqueness slot and counts toward no cap."""
    for rid in event.record_ids:
        state.records.pop(f"{ak}/{rid}", None)
