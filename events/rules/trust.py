"""A record's trust, worked out at read time from its trust inputs (docs/features/trust.md).

    score = 0.30 * confidence + 0.15 * importance + 0.15 * usage + 0.20 * utility + 0.20 * stability

each input in 0..1, so the score is too:

- confidence: the writer's (a model's or a tool's); unknown counts as 0.5.
- importance: the writer's, 0.5 unless set.
- usage: 1 - exp(-usage_count / 10): the first retrievals count most, and it never reaches 1,
  so a popular record cannot outweigh everything else.
- utility: learned from reported outcomes (the mean of a Beta(1 + successes, 1 + failures));
  0.5 until an outcome comes.
- stability: 0.5 ** (days since the record was last confirmed or changed / half-life), the
  half-life 30 days times (1 + confirmations): a fact restated from other runs fades slower,
  an old fact no one confirmed fades toward 0.

Derived here, not stored: stability depends on `now`, so a stored value would be stale the
moment it was written, and a change of weights needs no rewrite of the log. It ranks nothing:
search order is retrieval's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from events.commands import RecordUsage
from events.record import Provenance, Source

WEIGHTS = {"confidence": 0.30, "importance": 0.15, "usage": 0.15, "utility": 0.20, "stability": 0.20}
UNKNOWN_CONFIDENCE = 0.5
USAGE_SCALE = 10.0  # retrievals for usage to reach 1 - 1/e
HALF_LIFE_DAYS = 30.0  # stability of a fact never confirmed halves in this many days


def usage_value(usage_count: int) -> float:
    return 1.0 - math.exp(-max(0, usage_count) / USAGE_SCALE)


def stability(record: Any, now: datetime) -> tuple[float, float, float, int]:
    """(stability, days since last confirmed or changed, half-life in days, confirmations)."""
    confirmations = int(getattr(record, "confirmations", 0) or 0)
    since = record.modified or record.created
    days = max(0.0, (now - since).total_seconds() / 86400)
    half_life = HALF_LIFE_DAYS * (1 + confirmations)
    return 0.5 ** (days / half_life), days, half_life, confirmations


def _clamp(x: float) -> float:
    return min(1.0, max(0.0, x))


def breakdown(record: Any, now: datetime) -> dict[str, Any]:
    """Each input with its value (0..1), its weight and what it came from, and `score`."""
    s, days, half_life, confirmations = stability(record, now)
    conf = record.confidence
    inputs = {
        "confidence": {"value": UNKNOWN_CONFIDENCE if conf is None else conf, "known": conf is not None},
        "importance": {"value": record.importance},
        "usage": {"value": usage_value(record.usage_count), "usage_count": record.usage_count},
        "utility": {"value": record.utility},
        "stability": {"value": s, "days_since_confirmed": round(days, 3), "half_life_days": half_life,
                      "confirmations": confirmations},
    }
    score = 0.0
    for name, row in inputs.items():
        row["value"] = round(_clamp(row["value"]), 4)
        row["weight"] = WEIGHTS[name]
        score += WEIGHTS[name] * row["value"]
    return {"score": round(_clamp(score), 4), "inputs": inputs}


# ---------------------------------------------------------------- usage, as the trust worker folds it

MAX_IDS = 1000  # record ids per RecordUsage (its limit)
COUNTED_TOOLS = ("search_memory", "recall")  # history search hits are turns, not records


@dataclass
class UsageSpan:
    """An agent's `Retrieved` events in one partition of `memlane.usage`, offsets `first`..`last`."""

    tenant: str
    agent: str
    partition: int
    first: int
    last: int
    issued_at: datetime
    counts: dict[str, int] = field(default_factory=dict)

    def command(self) -> RecordUsage:
        """Its `RecordUsage`: the id names the span, so the same span sent again is the same
        command (and the ledger counts a span once whatever its id: `events.rules.ledger.usage`)."""
        return RecordUsage(
            command_id=f"usage:{self.partition}:{self.first}-{self.last}",
            tenant=self.tenant,
            agent=self.agent,
            issued_at=self.issued_at,
            provenance=Provenance(source=Source.OPERATOR, modified_by="trust"),
            counts=dict(self.counts),
            usage_partition=self.partition,
            from_offset=self.first,
            through_offset=self.last,
        )


def fold_usage(spans: dict[tuple[str, str], list[UsageSpan]], partition: int, offset: int, event: Any) -> None:
    """Adds a `memlane.usage` message to its agent's open span (a new one past `MAX_IDS` ids).
    Anything but a search's or a recall's `Retrieved` counts nothing."""
    if getattr(event, "type", None) != "Retrieved" or event.tool not in COUNTED_TOOLS or not event.items:
        return
    ids = [i.id for i in event.items]
    mine = spans.setdefault((event.tenant, event.agent), [])
    span = mine[-1] if mine else None
    if span is None or span.partition != partition or len(set(span.counts) | set(ids)) > MAX_IDS:
        span = UsageSpan(event.tenant, event.agent, partition, offset, offset, event.occurred_at)
        mine.append(span)
    span.last = offset
    span.issued_at = max(span.issued_at, event.occurred_at)
    for rid in ids[:MAX_IDS]:
        span.counts[rid] = span.counts.get(rid, 0) + 1


def usage_commands(spans: dict[tuple[str, str], list[UsageSpan]]) -> list[RecordUsage]:
    return [s.command() for mine in spans.values() for s in mine if s.counts]
