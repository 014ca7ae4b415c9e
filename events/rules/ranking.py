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

from collections.abc import Hashable, Mapping
from operator import itemgetter
from typing import NamedTuple, TypeVar

LEXICAL_WEIGHT = 0.7  # the dense list gets the rest
NEIGHBOUR_WEIGHT = 0.4  # of each neighbour's fused score, before and after
K = TypeVar("K", bound=Hashable)  # a candidate's key: a point id, in whatever form the caller keys them


class Place(NamedTuple):
    """Where a part sits: its conversation, then its order inside it. `session` and `at_ms`
    say whether the caller may see it; they never decide the order (the fields before them
    tell every part apart)."""

    conversation: str
    turn: int
    sequence: int
    part: int
    session: str = ""
    at_ms: int = 0


def scaled(scores: Mapping[K, float]) -> dict[K, float]:
    """Min-max over one list: its best 1, its worst 0 (a list of one, or of ties, all 1)."""
    if not scores:
        return {}
    lo, hi = min(scores.values()), max(scores.values())
    if hi <= lo:
        return dict.fromkeys(scores, 1.0)
    span = hi - lo
    return {k: (v - lo) / span for k, v in scores.items()}


def fused(lexical: Mapping[K, float], dense: Mapping[K, float], weight: float = LEXICAL_WEIGHT) -> dict[K, float]:
    """Each candidate's weighted sum of its scaled scores; a list that missed it gives 0."""
    out = {k: (1 - weight) * v for k, v in scaled(dense).items()}
    for k, v in scaled(lexical).items():
        out[k] = out.get(k, 0.0) + weight * v
    return out


def neighbours(places: Mapping[K, Place]) -> dict[K, list[K]]:
    """Each candidate's nearest candidates before and after it in its conversation, at most
    one turn away: the parts next to it, or, when those were not found, the closest that were."""
    out: dict[K, list[K]] = {k: [] for k in places}
    ordered = sorted(places.items(), key=itemgetter(1))
    for (a, pa), (b, pb) in zip(ordered, ordered[1:]):
        if pa[0] == pb[0] and pb[1] - pa[1] <= 1:
            out[a].append(b)
            out[b].append(a)
    return out


def lifted(scores: Mapping[K, float], near: Mapping[K, list[K]],
           weight: float = NEIGHBOUR_WEIGHT) -> dict[K, float]:
    """Each score plus `weight` of each neighbour's (computed from the scores before lifting)."""
    out = dict(scores)
    for k, ns in near.items():
        for n in ns:
            out[k] = out.get(k, 0.0) + weight * scores.get(n, 0.0)
    return out


def ranked(lexical: Mapping[K, float], dense: Mapping[K, float], places: Mapping[K, Place],
           weight: float = LEXICAL_WEIGHT, neighbour: float = NEIGHBOUR_WEIGHT) -> dict[K, float]:
    """The hybrid score of every candidate either list found."""
    return lifted(fused(lexical, dense, weight), neighbours(places), neighbour)
