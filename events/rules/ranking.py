"""Hybrid ranking of session history (pure): the lexical and the dense list fused by score,
then each candidate lifted by its neighbours in the conversation.

- Each list is scaled to 0..1 over what the engine returned for it (min-max), so neither
  BM25's unbounded scores nor an embedder's cosine range is assumed: a served embedder
  (`MEMLANE_EMBEDDINGS=openai`) ranks on the same terms as MiniLM.
- A message that answers a question often shares no word with it, while the message
  before or after it does (a question and its reply); each candidate gets a share of its
  neighbours' fused scores.

The weights were chosen on LoCoMo's tuning conversations alone (docs/history-ranking.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

LEXICAL_WEIGHT = 0.7  # the dense list gets the rest
NEIGHBOUR_WEIGHT = 0.4  # of each neighbour's fused score, before and after


class Place(NamedTuple):
    """Where a part sits: its conversation, then its order inside it."""

    conversation: str
    turn: int
    sequence: int
    part: int


def scaled(scores: Mapping[str, float]) -> dict[str, float]:
    """Min-max over one list: its best 1, its worst 0 (a list of one, or of ties, all 1)."""
    if not scores:
        return {}
    lo, hi = min(scores.values()), max(scores.values())
    span = hi - lo
    return {k: (v - lo) / span if span > 0 else 1.0 for k, v in scores.items()}


def fused(lexical: Mapping[str, float], dense: Mapping[str, float], weight: float = LEXICAL_WEIGHT) -> dict[str, float]:
    """Each candidate's weighted sum of its scaled scores; a list that missed it gives 0."""
    lex, den = scaled(lexical), scaled(dense)
    return {k: weight * lex.get(k, 0.0) + (1 - weight) * den.get(k, 0.0) for k in lex.keys() | den.keys()}


def neighbours(places: Mapping[str, Place]) -> dict[str, tuple[str, ...]]:
    """Each candidate's nearest candidates before and after it in its conversation, at most
    one turn away: the parts next to it, or, when those were not found, the closest that were."""
    out: dict[str, tuple[str, ...]] = {k: () for k in places}
    ordered = sorted(places, key=lambda k: places[k])
    for a, b in zip(ordered, ordered[1:]):
        pa, pb = places[a], places[b]
        if pa.conversation == pb.conversation and pb.turn - pa.turn <= 1:
            out[a] += (b,)
            out[b] += (a,)
    return out


def lifted(scores: Mapping[str, float], near: Mapping[str, tuple[str, ...]],
           weight: float = NEIGHBOUR_WEIGHT) -> dict[str, float]:
    """Each score plus `weight` of each neighbour's (computed from the scores before lifting)."""
    return {k: s + weight * sum(scores.get(n, 0.0) for n in near.get(k, ())) for k, s in scores.items()}


def ranked(lexical: Mapping[str, float], dense: Mapping[str, float], places: Mapping[str, Place],
           weight: float = LEXICAL_WEIGHT, neighbour: float = NEIGHBOUR_WEIGHT) -> dict[str, float]:
    """The hybrid score of every candidate either list found."""
    return lifted(fused(lexical, dense, weight), neighbours(places), neighbour)
