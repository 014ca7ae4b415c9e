"""Shadow replay's rules: what one extraction policy decided for a turn, how two policies' decisions
differ, which existing memories a review is shown, and how a policy scores against the facts a
turn should have kept."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from events.record import LIVE, MemoryRecord

SHOWN = 8  # existing memories a shadow review is shown, at most


@dataclass
class Decisions:
    """A policy's changes for one turn, by record text."""

    added: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)  # the texts that were replaced
    deleted: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, list[str]]:
        return {"added": sorted(self.added), "replaced": sorted(self.replaced), "deleted": sorted(self.deleted)}


def shown_text(r: MemoryRecord) -> str:
    """A record's text as a report shows it: a record naming a member (whatever its scope) is
    theirs to read, so it shows as whose it is, never its text."""
    return f"(a record of member {r.user})" if r.user is not None else r.summary


def decisions_of(events: Iterable[Any]) -> Decisions:
    """The record events one policy's commands made, as decisions. A write that restated a live
    record (merged) added nothing."""
    out = Decisions()
    for e in events:
        if e.type == "RecordAdded" and not getattr(e, "merged", False):
            out.added.append(shown_text(e.record))
        elif e.type == "RecordSuperseded":
            out.replaced.append(shown_text(e.record))
        elif e.type == "RecordDeleted":
            out.deleted.append(shown_text(e.record))
    return out


def differs(a: Decisions, b: Decisions) -> bool:
    return a.as_json() != b.as_json()


def words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


def similar(records: Iterable[MemoryRecord], queries: list[str], limit: int = SHOWN) -> list[MemoryRecord]:
    """The live records sharing the most words with the review's queries (ties: newest first); a
    shadow run has no index of its own, so it ranks by shared words."""
    asked = set().union(*(words(q) for q in queries)) if queries else set()
    scored = [(len(asked & words(f"{r.summary} {r.content}")), r) for r in records if r.status in LIVE]
    scored = [(n, r) for n, r in scored if n]
    scored.sort(key=lambda x: (-x[0], -x[1].created.timestamp()))
    return [r for _, r in scored[:limit]]


def normalized(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))


def score(kept: Mapping[str, list[str]], expected: Mapping[str, list[str]]) -> dict[str, Any]:
    """Precision and recall of the facts a policy kept (added), per turn, against the facts each
    turn should have kept; texts match when equal but for case and punctuation."""
    matched = n_kept = n_expected = 0
    for turn, want in expected.items():
        have = {normalized(t) for t in kept.get(turn, [])}
        wanted = {normalized(t) for t in want}
        matched += len(have & wanted)
        n_expected += len(wanted)
    n_kept = sum(len({normalized(t) for t in texts}) for turn, texts in kept.items() if turn in expected)
    return {"kept": n_kept, "expected": n_expected, "matched": matched,
            "precision": round(matched / n_kept, 3) if n_kept else None,
            "recall": round(matched / n_expected, 3) if n_expected else None}
