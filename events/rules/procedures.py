"""Procedures learned across runs, and how outcomes rank them (docs/features/consolidation.md). Pure.

A fact is *confirmed* when a later write from another run states it again (the ledger
merges the restatement into the live record: `confirm`). An approved pattern or a decision
stated in `PROMOTE_AT` runs with confidence at least `MIN_CONFIDENCE` becomes a procedure
(`promotes`, `procedure_of`), once: its id follows the fact's. Reported outcomes count on
the procedure (`validations`, `successes`, `failures`), and `rank` orders procedures by
relevance weighted by their smoothed success rate, with anti-patterns after the rest.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from events.record import MemoryRecord, Provenance, Source, Status

PROMOTED_KINDS = ("approved_pattern", "decision")
# Three runs: one run is an anecdote, two can be a coincidence of one user's habit; a third
# independent statement is the smallest count that is a pattern rather than a repeat.
PROMOTE_AT = 3  # statements: the write that made the fact, and PROMOTE_AT - 1 confirmations
# Extraction's confidences cluster around 0.7 for inferred facts and 0.9+ for stated ones: a
# procedure is followed without asking, so only facts someone stated plainly qualify.
MIN_CONFIDENCE = 0.8
NAMESPACE = uuid.UUID("0b7f6e2c-5d1a-4c8e-9a3b-6f2d1e4c8a57")


def _run(p: Provenance, session: str | None) -> tuple[str | None, str | None]:
    return p.execution_id, p.session or session


def same_run(a: Provenance, a_session: str | None, b: Provenance, b_session: str | None) -> bool | None:
    """Whether two writes came from one run: by execution when both name one, else by session;
    None when neither tells (a write that names no run)."""
    (ea, sa), (eb, sb) = _run(a, a_session), _run(b, b_session)
    if ea and eb:
        return ea == eb
    if sa and sb:
        return sa == sb
    return None


def confirm(r: MemoryRecord, by: Provenance, session: str | None, confidence: float | None,
            at: datetime) -> MemoryRecord | None:
    """The record's next version after a write from another run restated it: `confirmations`
    one up, the higher of the two confidences, `by` as the version's provenance (its episode
    kept when `by` names none). None when the write is of the run that last stated the fact,
    or names no run: a repeat within one run, or one we cannot place, is no evidence.

    The ledger calls this for an exact restatement (same normalised text); a near-duplicate
    merge counts the same way by calling it with the merging write's provenance and session."""
    if same_run(r.provenance, r.session, by, session) is not False:
        return None
    conf = max((c for c in (r.confidence, confidence) if c is not None), default=None)
    prov = by if by.episode or not r.provenance.episode else by.model_copy(update={"episode": r.provenance.episode})
    if not prov.session and session:
        prov = prov.model_copy(update={"session": session})
    return r.model_copy(update={"version": r.version + 1, "confirmations": r.confirmations + 1,
                                "confidence": conf, "modified": at, "provenance": prov})


def promotes(r: MemoryRecord) -> bool:
    """Whether a fact qualifies as a procedure now: a live approved pattern or decision, stated
    in at least `PROMOTE_AT` runs, with confidence at least `MIN_CONFIDENCE`."""
    return (r.kind in PROMOTED_KINDS and r.status is Status.ACTIVE and not r.preview
            and 1 + r.confirmations >= PROMOTE_AT and (r.confidence or 0.0) >= MIN_CONFIDENCE)


def procedure_id(fact: MemoryRecord) -> str:
    """The procedure a fact becomes: one id per fact, so it is made once however often asked."""
    return str(uuid.uuid5(NAMESPACE, f"procedure:{fact.tenant}/{fact.agent}/{fact.id}"))


def procedure_of(fact: MemoryRecord, at: datetime, expires_at: datetime | None) -> MemoryRecord:
    """The procedure record a promoted fact becomes: the fact's text, scope and labels; kind
    `procedure`, source CONSOLIDATION, and no outcome counted yet."""
    return fact.model_copy(update={
        "id": procedure_id(fact), "version": 1, "created": at, "modified": at, "kind": "procedure",
        "metadata": {"from_facts": [fact.id], "validations": 0, "successes": 0, "failures": 0,
                     "anti_pattern": False, "confirmations": fact.confirmations},
        "key": None, "status": Status.ACTIVE, "pinned": False, "replaces": None, "replaced_by": None,
        "expires_at": expires_at, "confirmations": 0, "observed_at": at, "valid_from": at, "valid_to": None,
        "recorded_at": at, "superseded_at": None,
        "provenance": Provenance(source=Source.CONSOLIDATION, modified_by="ledger", session=fact.session,
                                 user=fact.user, episode=fact.provenance.episode),
    })


def _count(r: MemoryRecord, name: str) -> int:
    try:
        return max(0, int(r.metadata.get(name, 0)))
    except (TypeError, ValueError):
        return 0


def is_anti_pattern(r: MemoryRecord) -> bool:
    return bool(r.metadata.get("anti_pattern"))


def success_rate(r: MemoryRecord) -> float:
    """(successes + 1) / (successes + failures + 2): a procedure without outcomes is at 0.5,
    and one outcome moves it, without taking it to 0 or 1."""
    s, f = _count(r, "successes"), _count(r, "failures")
    return (s + 1) / (s + f + 2)


def score(r: MemoryRecord, relevance: float) -> float:
    """Relevance weighted by the success rate, from half (always failed) to one and a half
    (always worked): outcomes reorder procedures of similar relevance, but never lift an
    unrelated one over a relevant one by more than threefold."""
    return relevance * (0.5 + success_rate(r))


def rank(procedures: list[MemoryRecord], relevance: dict[str, Any]) -> list[MemoryRecord]:
    """`procedures` (kind `procedure`), best first: those to follow by `score`, then the
    anti-patterns (`metadata.anti_pattern`) by relevance alone, after every procedure to follow.
    `relevance` maps a record id to its search score (higher is more relevant; a missing id
    is 0). Ties go to the higher success rate, then the id, so the order is deterministic."""
    def rel(r: MemoryRecord) -> float:
        return float(relevance.get(r.id) or 0.0)

    follow = [r for r in procedures if not is_anti_pattern(r)]
    avoid = [r for r in procedures if is_anti_pattern(r)]
    follow.sort(key=lambda r: (-score(r, rel(r)), -success_rate(r), r.id))
    avoid.sort(key=lambda r: (-rel(r), r.id))
    return follow + avoid
