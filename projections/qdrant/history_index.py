"""Qdrant Edge shard of session history: one point per part of a kept event.

Its own shard directory (`<data_dir>/qdrant/history-g<N>`), owned by the API process
like the memory shard. Dense (all-MiniLM) and BM25 sparse vectors; a hybrid search ranks
both lists by `projections.qdrant.ranking`. Flags are keyword strings: the Edge bindings do not match a
Python bool in MatchValue.

A part's text is sealed in its payload (`sealed`) under its subject's data key (the turn's
member's, else the agent's); the vectors made from it stay in the shard. A search opens the
parts it returns and leaves out those sealed under destroyed keys. `purge` removes what an
erasure reaches.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic_core import from_json, to_json
from qdrant_edge import (
    Bm25,
    Bm25Config,
    FieldCondition,
    Filter,
    IsEmptyCondition,
    MatchAny,
    MatchValue,
    Point,
    Query,
    QueryBatchRequest,
    QueryRequest,
    RangeFloat,
    UpdateOperation,
)

from events.codec import ContractError
from events.rules.history import HistoryFilter, KeptEvent, parts_of
from events.sealing import Cipher, KeyDestroyed, KeyMissing, open_text, seal_text, subject_of
from projections.qdrant import ranking
from projections.qdrant.edge_shard import DENSE, SPARSE, open_shard
from projections.records import Erasure

Mode = Literal["hybrid", "lexical", "vector"]
HYBRID_DEPTH = 200  # a hybrid search pages through at most this many parts: the dense list's depth
LEXICAL_DEPTH = 100  # the lexical list's: chosen on both tuning sets (docs/decisions/0019-history-ranking-score-fusion.md)
# BM25's length normalisation: the part length (in tokens) that counts as average. Edge weighs a
# part when it is written, so this is fixed; 128 was chosen on both tuning sets (Edge's own 256
# under-penalises long parts). A shard written with another value is re-weighed by a rebuild.
BM25_AVG_TOKENS = 128.0
PLACES_KEPT = 200_000  # points whose place a process keeps (about 200 bytes each)
TIEBREAK_BITS = (1 << 63) - 1  # of a point id, to settle ties in an int64
# Given the candidates' places, a test of whether the caller may see one (called where the search runs).
Visible = Callable[[list[ranking.Place]], Callable[[ranking.Place], bool]]


def bm25_config() -> Bm25Config:
    return Bm25Config(avg_len=BM25_AVG_TOKENS)


@dataclass(frozen=True)
class HistoryHit:
    score: float
    payload: dict[str, Any]


def part_payload(e: KeptEvent, text: str, part: int, parts: int) -> dict[str, Any]:
    return {
        "event_id": e.id,
        "tenant": e.tenant,
        "agent": e.agent,
        "session": e.session,
        "turn": e.turn,
        "attempt": e.attempt,
        "execution_id": e.execution_id,
        "sequence": e.sequence,
        "role": e.role,
        "kind": e.kind,
        "visibility": "preview" if e.preview else "live",
        "occurred_ms": e.occurred_ms,
        "call_id": e.call_id,
        "tool_name": e.tool_name,
        "calls": list(e.calls),
        "user": e.user,
        "part": part,
        "parts": parts,
        "chars": len(e.text),  # the message's: ranking shrinks a long message's neighbour lift
        "text": text,
    }


# Payload keys search filters or sorts on. The rest of a part's payload is one JSON string
# under `doc`, which Edge writes far faster than separate keys (docs/decisions/0004-qdrant-edge-embedded-index.md). A
# point written before `doc` existed reads as it was.
FILTERED = ("event_id", "tenant", "agent", "session", "turn", "kind", "visibility", "occurred_ms", "execution_id",
            "user", "sequence", "part", "chars")


def part_aad(p: dict[str, Any]) -> str:
    """A sealed part is bound to its event and place: it cannot be moved to another."""
    return f"history:{p['tenant']}/{p['agent']}/{p['session']}/{p['event_id']}#{p['part']}"


def pack(payload: dict[str, Any], c: Cipher | None) -> dict[str, Any]:
    """A part's payload as stored: filtered keys with a value, `doc` with the rest, and with
    a cipher `c` the text sealed apart (`sealed`), out of `doc`."""
    stored = {k: payload[k] for k in FILTERED if payload.get(k) is not None}
    if c is not None:
        subject = subject_of(payload["tenant"], payload["agent"], payload.get("user"))
        stored["sealed"] = seal_text(c, subject, part_aad(payload), payload["text"])
    stored["doc"] = to_json({k: v for k, v in payload.items()
                             if k not in stored and not (c is not None and k == "text")}).decode()
    return stored


def unpack(stored: dict[str, Any], c: Cipher | None) -> dict[str, Any]:
    """Raises `KeyMissing` or `KeyDestroyed` for a sealed text it cannot open."""
    if "doc" not in stored:
        return stored
    out = {k: v for k, v in stored.items() if k not in ("doc", "sealed")}
    out.update(from_json(stored["doc"]))
    if "sealed" in stored:
        if c is None:
            raise ContractError("sealed", "a sealed history part, and this process has no keys")
        out["text"] = open_text(c, part_aad(out), stored["sealed"])
    return out


def event_parts(e: KeptEvent) -> list[tuple[str, dict[str, Any]]]:
    """(point id, payload) of each part; a part's text is `payload["text"]`."""
    return [(pid, part_payload(e, t, part, parts)) for pid, part, parts, t in parts_of(e)]


class HistoryIndex:
    """Owns one Edge shard directory. An Edge shard belongs to one process."""

    def __init__(self, path: Path, dim: int = 384, cipher: Cipher | None = None) -> None:
        self.path = Path(path)
        self.cipher = cipher  # seals and opens the parts' texts
        self.bm25 = Bm25(bm25_config())
        # Re-entrant: a search in the event loop holds it throughout (`search_now`).
        self._lock = threading.RLock()
        self._places = Places()
        # The session is the tenant key: every history search stays inside one.
        self.shard = open_shard(
            self.path, dim, "session", ("tenant", "agent", "kind", "visibility", "execution_id", "event_id", "user"),
            ("turn", "occurred_ms"),
        )

    # ------------------------------------------------------------------ write side

    def upsert(self, items: list[tuple[str, dict[str, Any], list[float]]]) -> None:
        self.upsert_packed([(pid, pack(p, self.cipher), p["text"], vec) for pid, p, vec in items])

    def upsert_packed(self, items: list[tuple[str, dict[str, Any], str, list[float]]]) -> None:
        """(point id, `pack`ed payload, the part's text, its vector): for a caller that seals
        where it can publish a new key first, and embeds elsewhere."""
        points = [Point(pid, {DENSE: vec, SPARSE: self.bm25.embed_document(text)}, stored)
                  for pid, stored, text, vec in items]
        if points:
            with self._lock:
                self.shard.update(UpdateOperation.upsert_points(points))

    def purge(self, er: Erasure) -> None:
        """Removes every part an erasure reaches: of its agent (or every agent of the tenant),
        of its member's turns or, naming none, of every turn."""
        must = [FieldCondition("tenant", match=MatchValue(er.tenant))]
        if er.agent is not None:
            must.append(FieldCondition("agent", match=MatchValue(er.agent)))
        if er.user is not None:
            must.append(FieldCondition("user", match=MatchValue(er.user)))
        with self._lock:
            self.shard.update(UpdateOperation.delete_points_by_filter(Filter(must=must)))

    def delete_message(self, tenant: str, agent: str, session: str, message_id: str) -> None:
        """Removes every part of one message of a session."""
        must = [FieldCondition(k, match=MatchValue(v))
                for k, v in (("session", session), ("tenant", tenant), ("agent", agent), ("event_id", message_id))]
        with self._lock:
            self.shard.update(UpdateOperation.delete_points_by_filter(Filter(must=must)))

    def held(self, ids: list[str]) -> set[str]:
        """Which of these point ids the shard holds."""
        with self._lock:
            return {str(r.id) for r in self.shard.retrieve(ids, False, False)}

    def flush(self) -> None:
        with self._lock:
            self.shard.flush()

    def close(self) -> None:
        with self._lock:
            self.shard.flush()
            self.shard.close()

    def count(self) -> int:
        return self.shard.info().points_count

    # ------------------------------------------------------------------ read side

    @staticmethod
    def _filter(f: HistoryFilter) -> Filter:
        must = [
            FieldCondition("agent", match=MatchValue(f.agent)),
            FieldCondition("tenant", match=MatchValue(f.tenant)),
            FieldCondition("kind", match=MatchAny(list(f.kinds))),
        ]
        if f.session is not None:  # None: every session of the agent (history across conversations)
            must.insert(0, FieldCondition("session", match=MatchValue(f.session)))
        # A member's turns: only for the agent or helper speaking for that member (HistoryFilter.sees_member).
        # A part of no member stores no `user` key (pack leaves None out), as does one written before it existed.
        if f.operator or f.user is None:
            must.append(IsEmptyCondition("user"))
        else:
            must.append(Filter(should=[IsEmptyCondition("user"), FieldCondition("user", match=MatchValue(f.user))]))
        if not f.preview:
            must.append(FieldCondition("visibility", match=MatchValue("live")))
        if f.before_turn is not None:
            must.append(FieldCondition("turn", range=RangeFloat(lt=f.before_turn)))
        if f.conversation:
            must.append(FieldCondition("execution_id", match=MatchValue(f.conversation)))
        if f.since_ms is not None or f.until_ms is not None:
            must.append(FieldCondition("occurred_ms", range=RangeFloat(gte=f.since_ms, lt=f.until_ms)))
        if f.ids:
            must.append(FieldCondition("event_id", match=MatchAny(list(f.ids))))
        return Filter(must=must)

    def search_now(self, *args: Any, **kwargs: Any) -> list[HistoryHit] | None:
        """`search`, unless a write or another search holds the shard: then None, at once. For
        a caller that must not wait (the event loop), and whose `visible` does not wait on it."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self.search(*args, **kwargs)
        finally:
            self._lock.release()

    def search(
        self, f: HistoryFilter, dense: list[float] | None, text: str, limit: int, offset: int = 0, mode: Mode = "hybrid",
        missing_ok: bool = False, visible: Visible | None = None, window: tuple[int, int] | None = None,
    ) -> list[HistoryHit]:
        """Ranked parts `offset .. offset+limit`; newer events win ties. A part sealed under a
        destroyed key is left out; one under a key not known yet raises `KeyMissing`, unless
        `missing_ok` (the caller caught up already: the key was destroyed). `visible` (hybrid):
        which candidates the caller may see, for what the filter cannot say (membership windows);
        the others are left out before ranking, so they lift no neighbour. `window` (hybrid, Unix
        ms): the time the question names, whose parts rank first (`ranking.timed`)."""
        flt = self._filter(f)
        if mode == "hybrid":
            return self._hybrid(flt, dense, text, limit, offset, missing_ok, visible, window)
        query = Query.Nearest(self.bm25.embed_query(text), using=SPARSE) if mode == "lexical" else \
            Query.Nearest(dense, using=DENSE)
        # One message beyond the page, so ties at the page edge are ordered the same on every page.
        wanted = offset + limit + 1
        depth = wanted
        while True:
            with self._lock:
                points = {p.id.int: p for p in self.shard.query(
                    QueryRequest(limit=depth, query=query, filter=flt, with_payload=True))}
            keys = list(points)
            scores = np.fromiter((points[k].score for k in keys), float, len(keys))
            rows = ranking.rows_of([place(points[k].payload) for k in keys])
            # A message is one hit, its best part, as in a hybrid search; when a long message's
            # parts took places the page needs, look deeper.
            kept = ranking.best_parts(scores, rows)
            if len(kept) >= wanted or len(points) < depth:
                break
            depth *= 2
        return _page([keys[i] for i in kept.tolist()], scores[kept], rows[kept],
                     lambda chunk: {k: points[k].payload for k in chunk}, offset, limit, missing_ok, self.cipher)

    def _hybrid(self, flt: Filter, dense: list[float] | None, text: str, limit: int, offset: int,
                missing_ok: bool, visible: Visible | None, window: tuple[int, int] | None = None) -> list[HistoryHit]:
        """Both lists to fixed depths (so the order is the same on every page), ranked by
        `projections.qdrant.ranking`; whole payloads are read only as far down as the page reaches."""
        # The lists carry no payload: a query that returns payloads costs several times one
        # that does not (docs/decisions/0019-history-ranking-score-fusion.md).
        lexical = QueryRequest(limit=LEXICAL_DEPTH, query=Query.Nearest(self.bm25.embed_query(text), using=SPARSE),
                               filter=flt, with_payload=False)
        nearest = QueryRequest(limit=HYBRID_DEPTH, query=Query.Nearest(dense, using=DENSE), filter=flt,
                               with_payload=False)
        with self._lock:
            found_lex, found_den = self.shard.query_batch(QueryBatchRequest([lexical, nearest]))
        # Points are keyed by their id as an int: Edge makes a UUID at every read of `id`, and
        # a string of each would cost as much again (docs/decisions/0019-history-ranking-score-fusion.md).
        lex = {p.id.int: p.score for p in found_lex}
        den = {p.id.int: p.score for p in found_den}
        with self._lock:
            keys, rows, places = self._places.of(list(dict.fromkeys([*lex, *den])), self._read_places)
        if visible is not None and keys:
            seen = visible(places)
            kept = np.fromiter((seen(p) for p in places), bool, len(places))
            keys, rows = [k for k, keep in zip(keys, kept, strict=True) if keep], rows[kept]
        kept, scores = ranking.ranked(np.fromiter((lex.get(k, ranking.MISSED) for k in keys), float, len(keys)),
                                      np.fromiter((den.get(k, ranking.MISSED) for k in keys), float, len(keys)), rows,
                                      window=window)
        return _page([keys[i] for i in kept.tolist()], scores, rows[kept], self._payloads, offset, limit, missing_ok,
                     self.cipher)

    def _read_places(self, keys: list[int]) -> dict[int, ranking.Place]:
        return {k: place(p) for k, p in self._payloads(keys).items()}

    def _payloads(self, keys: list[int]) -> dict[int, dict[str, Any]]:
        with self._lock:
            got = self.shard.retrieve([str(uuid.UUID(int=k)) for k in keys], True, False)
        return {r.id.int: r.payload for r in got}


class Places:
    """Where each point sits, kept across searches since a part's place never changes: its
    `Place`, and its row for `projections.qdrant.ranking` in one array, so a search gathers its
    candidates' rows in one step. Past `kept` points it starts again, read back as searches
    need them. Its caller holds the shard's lock, which also keeps searches apart here."""

    def __init__(self, kept: int = PLACES_KEPT) -> None:
        self.kept = kept
        self._clear()

    def _clear(self) -> None:
        self._slot: dict[int, int] = {}
        self._place: list[ranking.Place] = []
        self._rows = np.zeros((1024, ranking.COLUMNS), dtype=np.int64)
        self._codes: dict[str, int] = {}

    def of(self, keys: list[int], read: Callable[[list[int]], dict[int, ranking.Place]]
           ) -> tuple[list[int], np.ndarray, list[ranking.Place]]:
        """The keys whose place is known or `read` finds (in order), their rows and places."""
        if len(self._place) > self.kept:
            self._clear()
        missing = [k for k in keys if k not in self._slot]
        if missing:
            self._add(read(missing))
        keys = [k for k in keys if k in self._slot]
        slots = np.fromiter((self._slot[k] for k in keys), np.intp, len(keys))
        return keys, self._rows[slots], [self._place[i] for i in slots.tolist()]

    def _add(self, found: dict[int, ranking.Place]) -> None:
        start = len(self._place)
        while start + len(found) > len(self._rows):
            self._rows = np.concatenate([self._rows, np.zeros_like(self._rows)])
        self._rows[start : start + len(found)] = ranking.rows_of(list(found.values()), self._codes)
        self._slot.update((k, start + i) for i, k in enumerate(found))
        self._place.extend(found.values())


def place(stored: dict[str, Any]) -> ranking.Place:
    """Where a stored part sits in its conversation, read without opening its text (a point
    written before `sequence` was kept beside `doc` has it inside)."""
    doc = from_json(stored["doc"]) if "sequence" not in stored and "doc" in stored else stored
    return ranking.Place(f"{stored['session']}/{stored.get('execution_id') or ''}", int(stored["turn"]),
                         int(doc.get("sequence") or 0), int(doc.get("part") or 0), stored["session"],
                         int(stored.get("occurred_ms") or 0), int(stored.get("chars") or 0))


def _page(keys: list[int], scores: np.ndarray, rows: np.ndarray,
          payloads: Callable[[list[int]], dict[int, dict[str, Any]]], offset: int, limit: int,
          missing_ok: bool, cipher: Cipher | None) -> list[HistoryHit]:
    """Hits `offset .. offset+limit` in `ranking.order`. A part sealed under a destroyed key is
    left out, as is one gone since the query; one under a key not known yet raises
    `KeyMissing`, unless `missing_ok`. Payloads are read down the order only as far as the page
    reaches."""
    tiebreak = np.fromiter((k & TIEBREAK_BITS for k in keys), np.int64, len(keys))
    order = [keys[i] for i in ranking.order(scores, rows, tiebreak)]
    score_of = dict(zip(keys, scores.tolist(), strict=True))
    hits: list[HistoryHit] = []
    start = 0
    while len(hits) < offset + limit and start < len(order):
        chunk = order[start : start + offset + limit - len(hits)]
        start += len(chunk)
        got = payloads(chunk)
        for key in chunk:
            if key not in got:
                continue
            try:
                hits.append(HistoryHit(score_of[key], unpack(got[key], cipher)))
            except KeyDestroyed:
                continue
            except KeyMissing:
                if not missing_ok:
                    raise
    return hits[offset : offset + limit]
