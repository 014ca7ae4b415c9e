"""What the activity view counts of a message: the Memory tab's chart of turns, extraction
decisions and recalls per minute, and each record's recalls (docs/features/activity.md).

Everything counted carries the id that makes it count once (`Tick.member`): a turn's attempt,
an extraction command, a usage record. The view adds these ids to sets, so reading a message
twice (a replay, a redelivery, two API processes following the same topics) counts it once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec

from events.memory import RecordAdded, RecordDeleted, RecordSuperseded
from events.record import Source
from events.topics import EVENTS, TURNS, USAGE
from events.turns import TurnCommitted, TurnRolledBack
from events.usage import CandidateRefused, Retrieved

KINDS = ("turns", "decisions", "recalls")
# Per-minute counts are kept this long: the chart shows the last hour, and a reader that
# starts late still finds the hour before it complete.
KEEP_MINUTES = 120

# The message types each topic has anything to count in; the rest are never decoded.
WANTED: dict[str, frozenset[str]] = {
    TURNS.name: frozenset({"TurnCommitted", "TurnRolledBack"}),
    EVENTS.name: frozenset({"RecordAdded", "RecordSuperseded", "RecordDeleted"}),
    USAGE.name: frozenset({"Retrieved", "CandidateRefused"}),
}


@dataclass(frozen=True)
class Tick:
    """One thing counted once in one minute of one agent."""

    kind: str  # one of KINDS
    what: str  # committed, rolled_back; added, superseded, deleted, refused; recall
    tenant: str
    agent: str
    minute: int  # whole minutes since the epoch, UTC
    member: str  # tenant/agent/<id>: the id it counts once by


@dataclass(frozen=True)
class Recalled:
    """A recall that named these records (each once, whatever versions it showed)."""

    tenant: str
    agent: str
    record_ids: tuple[str, ...]
    usage_id: str
    at_ms: int


@dataclass(frozen=True)
class Counted:
    ticks: tuple[Tick, ...] = ()
    recalled: Recalled | None = None


NOTHING = Counted()


class _Type(msgspec.Struct):
    type: str = ""


_TYPE = msgspec.json.Decoder(_Type)


def worth_decoding(topic: str, value: bytes | None) -> bool:
    """Whether a message of `topic` (its registry name) may count anything: its type is one
    `WANTED`, and a memory event names the EXTRACTION source. Most events are neither, and
    are skipped without opening their sealed fields. A turn or usage message that is not
    JSON is worth decoding: the codec then says why it is poison."""
    if not value:
        return False
    if topic == EVENTS.name and b'"EXTRACTION"' not in value:
        return False
    try:
        kind = _TYPE.decode(value).type
    except msgspec.DecodeError:
        return True
    return kind in WANTED.get(topic, ())


def minute_of(at: datetime) -> int:
    return int(at.timestamp() // 60)


def fresh(minute: int, now_minute: int) -> bool:
    """Whether a minute is still kept (replays of older messages add nothing)."""
    return minute > now_minute - KEEP_MINUTES


def _member(m: Any, ident: str) -> str:
    return f"{m.tenant}/{m.agent}/{ident}"


def _turn(m: TurnCommitted | TurnRolledBack) -> Counted:
    # A turn's attempt, committed or rolled back, is one turn: by its turn_ref.
    what = "committed" if isinstance(m, TurnCommitted) else "rolled_back"
    return Counted((Tick("turns", what, m.tenant, m.agent, minute_of(m.occurred_at), _member(m, f"t:{m.turn_ref}")),))


_DECIDED = {RecordAdded: "added", RecordSuperseded: "superseded", RecordDeleted: "deleted"}


def _decision(m: RecordAdded | RecordSuperseded | RecordDeleted) -> Counted:
    # One extraction command is one decision: a replace writes RecordSuperseded and
    # RecordAdded under the same command id, and counts once.
    if m.provenance.source is not Source.EXTRACTION:
        return NOTHING
    return Counted((Tick("decisions", _DECIDED[type(m)], m.tenant, m.agent, minute_of(m.occurred_at),
                         _member(m, f"c:{m.command_id}")),))


def _refused(m: CandidateRefused) -> Counted:
    return Counted((Tick("decisions", "refused", m.tenant, m.agent, minute_of(m.occurred_at),
                         _member(m, f"u:{m.usage_id}")),))


def _retrieved(m: Retrieved) -> Counted:
    if not m.recall:
        return NOTHING  # a search, not a recall
    ids = tuple(dict.fromkeys(i.id for i in m.items))
    tick = Tick("recalls", "recall", m.tenant, m.agent, minute_of(m.occurred_at), _member(m, f"u:{m.usage_id}"))
    return Counted((tick,), Recalled(m.tenant, m.agent, ids, m.usage_id, int(m.occurred_at.timestamp() * 1000)))


_HANDLERS: dict[type, Callable[[Any], Counted]] = {
    TurnCommitted: _turn,
    TurnRolledBack: _turn,
    RecordAdded: _decision,
    RecordSuperseded: _decision,
    RecordDeleted: _decision,
    CandidateRefused: _refused,
    Retrieved: _retrieved,
}


def counted(message: Any, redelivered: bool = False) -> Counted:
    """What one decoded message of memlane.turns, memlane.memory.events or memlane.usage
    counts. A redelivered event (the ledger's copy, `events.topics.REDELIVERED`) counts
    nothing: its original came first."""
    handler = _HANDLERS.get(type(message))
    if handler is None or redelivered:
        return NOTHING
    return handler(message)
