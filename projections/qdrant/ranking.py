"""Hybrid ranking (pure): the lexical and the dense list fused by score and, for session
history, each candidate lifted by its neighbours in the conversation.

- Each list is scaled to 0..1 over what the engine returned for it (min-max), so neither
  BM25's unbounded scores nor an embedder's cosine range is assumed: a served embedder
  (`MEMLANE_EMBEDDINGS=openai`) ranks on the same terms as MiniLM.
- A long message kept in parts is one candidate: its best part, with that part's fused score,
  so one message never fills a page with its parts and the part that answers is the one shown.
- A message that answers a question often shares no word with it, while the message
  before or after it does (a question and its reply); each history candidate gets a share of
  its neighbours' fused scores. A long message carries its own context, so the share shrinks
  with its length past `SHORT_CHARS`. A memory record stands alone: it is fused only (`fused_keys`).
- A question that names a time ("last Saturday", "in March": `events.rules.named_time`) lifts
  what was said inside that window by `TIME_WEIGHT`: a prior, so a message outside it can still win.

The rules work on arrays, one row per candidate: a history search ranks a few hundred, and
loops over them in Python cost more than the engine's search (docs/decisions/0019-history-ranking-score-fusion.md).
`ranked_keys` applies them to mappings keyed by anything. The weights were chosen on LoCoMo's
tuning conversations, and the length rule on them and LongMemEval_S's tuning half together
(docs/decisions/0019-history-ranking-score-fusion.md).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import NamedTuple, TypeVar

import numpy as np

LEXICAL_WEIGHT = 0.7  # the dense list gets the rest
NEIGHBOUR_WEIGHT = 0.4  # of each neighbour's fused score, before and after
SHORT_CHARS = 600  # a message up to this long takes the whole neighbour share; a longer one, SHORT_CHARS/its length
TIME_WEIGHT = 0.5  # added to a candidate said inside the window the question names
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
    chars: int = 0  # the whole message's length; 0 when not known (a point written before it was kept)


COLUMNS = 6


def rows_of(places: Sequence[Place], codes: dict[str, int] | None = None) -> np.ndarray:
    """The places as an (n, 6) int array: a code for the conversation (from `codes`, which
    gains new ones), turn, sequence, part, the message's length, and when it was said (Unix ms)."""
    codes = {} if codes is None else codes
    return np.array([(codes.setdefault(p.conversation, len(codes)), p.turn, p.sequence, p.part, p.chars, p.at_ms)
                     for p in places], dtype=np.int64).reshape(-1, COLUMNS)


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


def shares(rows: np.ndarray) -> np.ndarray:
    """The share of the neighbour lift each candidate takes: 1 up to `SHORT_CHARS` (or an unknown
    length), `SHORT_CHARS`/its length beyond."""
    chars = rows[:, 4].astype(float)
    return np.where(chars > SHORT_CHARS, SHORT_CHARS / np.maximum(chars, 1.0), 1.0)


def lifted(scores: np.ndarray, pairs: tuple[np.ndarray, np.ndarray], weight: float = NEIGHBOUR_WEIGHT,
           share: np.ndarray | None = None) -> np.ndarray:
    """Each score plus `weight` (times its `share`) of each neighbour's (as it was before
    lifting). A candidate is at most once the first and once the second of a pair, so each
    index is added to once."""
    a, b = pairs
    w = np.full(len(scores), weight) if share is None else weight * share
    out = scores.copy()
    out[a] += w[a] * scores[b]
    out[b] += w[b] * scores[a]
    return out


def timed(scores: np.ndarray, at: np.ndarray, window: tuple[int, int] | None,
          weight: float = TIME_WEIGHT) -> np.ndarray:
    """Each score plus `weight` when its candidate was said (`at`, Unix ms) inside `window`
    (since inclusive, until exclusive); unchanged without a window."""
    if window is None:
        return scores
    return scores + weight * ((at >= window[0]) & (at < window[1]))


def best_parts(scores: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The index of each message's best-scoring part (ties: its first), in candidate order."""
    if not len(rows):
        return np.zeros(0, dtype=np.intp)
    by = np.lexsort((rows[:, 3], -scores, rows[:, 2], rows[:, 1], rows[:, 0]))
    msg = rows[by, :3]
    first = np.ones(len(by), bool)
    first[1:] = (msg[1:] != msg[:-1]).any(axis=1)
    return np.sort(by[first])


def ranked(lexical: np.ndarray, dense: np.ndarray, rows: np.ndarray, weight: float = LEXICAL_WEIGHT,
           neighbour: float = NEIGHBOUR_WEIGHT, window: tuple[int, int] | None = None,
           time_weight: float = TIME_WEIGHT) -> tuple[np.ndarray, np.ndarray]:
    """(the candidates kept, their hybrid scores), from each candidate's raw score in each list
    (`MISSED` where that list did not find it) and its row (`rows_of`): each message's best part,
    lifted by the messages next to it, then by the `window` the question names."""
    scores = fused(lexical, dense, weight)
    kept = best_parts(scores, rows)
    rows = rows[kept]
    if not len(rows):
        return kept, scores[kept]
    return kept, timed(lifted(scores[kept], neighbours(rows), neighbour, shares(rows)), rows[:, 5], window,
                       time_weight)


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
                weight: float = LEXICAL_WEIGHT, neighbour: float = NEIGHBOUR_WEIGHT,
                window: tuple[int, int] | None = None, time_weight: float = TIME_WEIGHT) -> dict[K, float]:
    """`ranked` over mappings: the hybrid score of every message's best part either list found."""
    keys, lex, den = _columns(lexical, dense)
    kept, scores = ranked(lex, den, rows_of([places[k] for k in keys]), weight, neighbour, window, time_weight)
    return dict(zip([keys[i] for i in kept.tolist()], scores.tolist(), strict=True))


def fused_keys(lexical: Mapping[K, float], dense: Mapping[K, float], weight: float = LEXICAL_WEIGHT,
               at: Mapping[K, int] | None = None, window: tuple[int, int] | None = None) -> dict[K, float]:
    """`fused` over mappings, for candidates that stand alone (memory records: no neighbours),
    then `timed` by when each was said (`at`, Unix ms; -1 where not known)."""
    keys, lex, den = _columns(lexical, dense)
    scores = fused(lex, den, weight)
    if at is not None and window is not None:
        scores = timed(scores, np.array([at.get(k, -1) for k in keys], dtype=np.int64), window)
    return dict(zip(keys, scores.tolist(), strict=True))
