"""The scheduled expiry sweep: what the ledger's own tick asks itself to tombstone.

Reads skip a record past its `expires_at` at once; the sweep writes the tombstone
(`RecordExpired`) into the log, so history, projections and rebuilds show when it went.
`due` names the live records of a state past their expiry at `now` as `SweepExpired`
commands, which the ledger sends to its own input: decided like any other command, as of
their own `issued_at`, so a replay decides the same and the log shows who swept
(`Provenance.modified_by = "schedule"`). `next_sweep` says when the next one is due.

Pure: no clock, no I/O. The worker (`workers.processors.ledger.processor`) reads the clock and sends.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import msgspec

from events.commands import SweepExpired
from events.record import LIVE, Provenance, Source, Status
from events.rules.ledger.state import NAMESPACE, LedgerState

BATCH = 500  # ids per command, as `memlane sweep` sends them (the command's own limit is 1,000)
MODIFIED_BY = "schedule"


class _Expiry(msgspec.Struct):
    """The three fields a sweep reads of a record's JSON: decoding only them costs about a
    third of a full lean record."""

    id: str
    status: Status = Status.ACTIVE
    expires_at: datetime | None = None


_EXPIRY = msgspec.json.Decoder(_Expiry)


@dataclass
class Sweep:
    """A sweep's commands, and the records they name (`agent/rid`, as the state keys them)."""

    commands: list[Any] = field(default_factory=list)
    names: set[str] = field(default_factory=set)
    # Of the records `asked` named, those still live and expired: their sweep still waits.
    waiting: set[str] = field(default_factory=set)


def next_sweep(now: datetime, every_s: float) -> datetime | None:
    """When the sweep after one at `now` is due; None when sweeps are off (`every_s` 0)."""
    return now + timedelta(seconds=every_s) if every_s > 0 else None


def is_due(now: datetime, at: datetime | None) -> bool:
    return at is not None and now >= at


def expired_keys(state: LedgerState, now: datetime,
                 records: Iterable[tuple[str, bytes]] | None = None) -> list[str]:
    """The keys (`tenant/agent/rid`) of the live records past their expiry at `now`."""
    out = []
    for key, raw in state.records.items() if records is None else records:
        r = _EXPIRY.decode(raw)
        if r.status in LIVE and r.expires_at is not None and r.expires_at <= now:
            out.append(key)
    return out


def due(state: LedgerState, now: datetime, asked: frozenset[str] | set[str] = frozenset(),
        batch: int = BATCH) -> Sweep:
    """`SweepExpired` commands, as of `now`, for the live records past their expiry, leaving
    out those in `asked` (named by a sweep still waiting in the ledger's input: asking again
    would only decide nothing twice). One command per agent and batch of ids; its id names the
    agent, the time and the batch, so the same sweep asked twice is the same commands."""
    sweep = Sweep()
    by_agent: dict[str, list[str]] = {}
    for key in expired_keys(state, now):
        if key in asked:
            sweep.waiting.add(key)
            continue
        ak, rid = key.rsplit("/", 1)
        by_agent.setdefault(ak, []).append(rid)
        sweep.names.add(key)
    run = now.isoformat()
    for ak, ids in sorted(by_agent.items()):
        tenant, agent = ak.split("/", 1)
        ids.sort()
        for i in range(0, len(ids), batch):
            chunk = ids[i:i + batch]
            sweep.commands.append(SweepExpired(
                command_id=f"sweep:{uuid.uuid5(NAMESPACE, f'{ak}|{run}|{chunk[0]}')}",
                tenant=tenant, agent=agent, issued_at=now, record_ids=chunk,
                provenance=Provenance(source=Source.OPERATOR, modified_by=MODIFIED_BY),
            ))
    return sweep
