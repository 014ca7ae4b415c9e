"""Hybrid ranking (pure): the lexical and the dense list fused by score and, for session
history, each candidate lifted by its neighbours in the conversation.

- Each list is scaled to 0..1 over what the engine returned for it (min-max), so neither
  BM25's unbounded scores nor an embedder's cosine range is assumed: a served embedder
  (`MEMLANE_EMBEDDINGS=openai`) ranks on the same terms as MiniLM.
- A message that answers a question often shares no word with it, while the message
  before or after it does (a question and its reply); each history candidate gets a share of
  its neighbours' fused scores. A memory record stands alone: it is fused only (`fused_keys`).

The rules work on arrays, one row per candidate: a history search ranks a few hundred, and
loops over them in Python cost more than the engine's search (docs/decisions/0019-history-ranking-score-fusion.md).
`ranked_keys` applies them to mappings keyed by anything. The weights were chosen on LoCoMo's
tuning conversations alone.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import NamedTuple, TypeVar

import numpy as np

LEXICAL_WEIGHT = 0.7  # the dense list gets the rest
NEIGHBOUR_WEIGHT = 0.4  # of each neighbour's fused score, before and after
MISSED = np.nan  # a list's score for a candidate it did not find
K = TypeVar("K", bound=Hashable)


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


def rows_of(places: Sequence[Place], codes: dict[str, int] | None = None) -> np.ndarray:
    """The places as an (n, 4) int array: a code for the conversation (from `codes`, which
    gains new ones), turn, sequence, part."""
    codes = {} if codes is None else codes
    return np.array([(codes.setdefault(p.conversation, len(codes)), p.turn, p.sequence, p.part) for p in places],
                    dtype=np.int64).reshape(-1, 4)


def scaled(scores: np.ndarray) -> np.ndarray:
    """Min-max over the candidates one list found: its best 1, its worst 0 (a list of one, or
    of ties, all 1); a candidate it missed (`MISSED`) 0."""
    found = ~np.isnan(scores)
    out = np.zeros(len(scores))
    if found.any():
        got = scores[found]
        lo, hi = got.min(), got.max()
        out[found] = (got - lo) / (hi - lo) if hi > lo else 1.0
    return out


def fused(lexical: np.ndarray, dense: np.ndarray, weight: float = LEXICAL_WEIGHT) -> np.ndarray:
    """Each candidate's weighted sum of its scaled scores; a list that missed it gives 0."""
    return weight * scaled(lexical) + (1 - weight) * scaled(dense)


def neighbours(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (a[i], b[i]) of candidates next to each other in one conversation, at most one
    turn apart: the parts next to each other or, when those were not found, the closest that were."""
    order = np.lexsort(rows.T[::-1])  # by conversation, turn, sequence, part
    a, b = order[:-1], order[1:]
    near = (rows[a, 0] == rows[b, 0]) & (rows[b, 1] - rows[a, 1] <= 1)
    return a[near], b[near]


def lifted(scores: np.ndarray, pairs: tuple[np.ndarray, np.ndarray], weight: float = NEIGHBOUR_WEIGHT) -> np.ndarray:
    """Each score plus `weight` of each neighbour's (as it was before lifting). A candidate
    is at most once the first and once the second of a pair, so each index is added to once."""
    a, b = pairs
    out = scores.copy()
    out[a] += weight * scores[b]
    out[b] += weight * scores[a]
    return out


def ranked(lexical: np.ndarray, dense: np.ndarray, rows: np.ndarray, weight: float = LEXICAL_WEIGHT,
           neighbour: float = NEIGHBOUR_WEIGHT) -> np.ndarray:
    """The hybrid score of each candidate: its raw score in each list (`MISSED` where that list
    did not find it) and its row (`rows_of`)."""
    scores = fused(lexical, dense, weight)
    return lifted(scores, neighbours(rows), neighbour) if len(rows) else scores


def order(scores: np.ndarray, rows: np.ndarray, tiebreak: np.ndarray) -> np.ndarray:
    """Candidates best first. Ties (to 9 decimals) go to newer events: later turn, then later in
    it, then the earlier part; `tiebreak` (ints, in practice unique per candidate: the caller's
    ids' low bits) settles the rest, so every page of a search sees one order."""
    return np.lexsort((tiebreak, rows[:, 3], -rows[:, 2], -rows[:, 1], -np.round(scores, 9)))


def _columns(lexical: Mapping[K, float], dense: Mapping[K, float]) -> tuple[list[K], np.ndarray, np.ndarray]:
    """Every candidate either list found, and its score in each (`MISSED` where absent)."""
    keys = list(dict.fromkeys([*lexical, *dense]))
    return (keys, np.array([lexical.get(k, MISSED) for k in keys], dtype=float),
            np.array([dense.get(k, MISSED) for k in keys], dtype=float))


def ranked_keys(lexical: Mapping[K, float], dense: Mapping[K, float], places: Mapping[K, Place],
                weight: float = LEXICAL_WEIGHT, neighbour: float = NEIGHBOUR_WEIGHT) -> dict[K, float]:
    """`ranked` over mappings: the hybrid score of every candidate either list found."""
    keys, lex, den = _columns(lexical, dense)
    return dict(zip(keys, ranked(lex, den, rows_of([places[k] for k in keys]), weight, neighbour).tolist(), strict=True))


def fused_keys(lexical: Mapping[K, float], dense: Mapping[K, float], weight: float = LEXICAL_WEIGHT) -> dict[K, float]:
    """`fused` over mappings, for candidates that stand alone (memory records: no neighbours)."""
    keys, lex, den = _columns(lexical, dense)
    return dict(zip(keys, fused(lex, den, weight).tolist(), strict=True))
