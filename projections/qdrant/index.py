"""Qdrant Edge adapter: one point per live record, dense + BM25 sparse vectors.

The point id is uuid5 of the tenant, the agent and the record id, so two agents' records
never share a point even if their record ids are equal. The payload carries what searches
filter on, with payload indexes (the agent indexed as the tenant key), and the record id to map back.
Only ACTIVE records are points:
superseded, deleted, pending and conflicting records leave the index but stay readable
from Redis.
"""

from __future__ import annotations

import functools
import json
import threading
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from qdrant_edge import (
    Bm25,
    Bm25Config,
    FieldCondition,
    Filter,
    MatchAny,
    MatchPrefix,
    MatchValue,
    PayloadSelector,
    Point,
    Query,
    QueryBatchRequest,
    QueryRequest,
    ScrollRequest,
    UpdateOperation,
)

from events.ids import uuid5
from events.record import MemoryRecord, Status
from projections.qdrant import ranking
from projections.qdrant.edge_shard import DENSE, SPARSE, open_shard
from projections.records import Erasure

if TYPE_CHECKING:
    from events.lean import LeanRecord

POINT_NS = uuid.UUID("7f1c8a52-9d7e-4a8e-b7e4-3c0c5f2b6d10")
Mode = Literal["hybrid", "lexical", "vector"]
SCROLL_PAGE = 1000


def point_id(tenant: str, agent: str, record_id: str) -> str:
    """uuid5(POINT_NS, tenant NUL agent NUL record id). NUL is in no name, so no two triples
    spell the same name."""
    return uuid5(POINT_NS, f"{tenant}\0{agent}\0{record_id}")


def label_terms(labels: dict[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in sorted(labels.items())]


def tag_terms(tags: Iterable[str]) -> list[str]:
    """Tags share the labels' keyword index: a tag holds no "=", which every label term does."""
    return [f"#{t}" for t in tags]


@dataclass(frozen=True)
class SearchFilter:
    tenant: str
    agent: str
    scopes: tuple[str, ...]  # "AGENT", "SESSION" and/or "USER"
    session: str | None
    preview: bool
    kind: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    ids: tuple[str, ...] = ()
    user: str | None = None  # the member whose USER records the search reaches ("USER" in scopes)
    kinds: tuple[str, ...] = ()  # any of these kinds (recall's episodes and procedures)
    tags: tuple[str, ...] = ()  # every one of these tags
    not_kinds: tuple[str, ...] = ()  # none of these (recall's facts)


class IndexUnavailable(Exception):
    """The index could not answer: its storage or its server failed. Both adapters raise it,
    so a reader tells memory being unreadable from a fault of its own (a recall answers the
    first with an empty block and goes on)."""


@dataclass(frozen=True)
class Hit:
    record_id: str
    score: float
    at: int = -1  # when the record's fact was said (Unix ms); -1 not known


def reach_of(r: MemoryRecord) -> str:
    """Who a record reaches: the whole agent, one session, or one member (a USER record is
    its member's only, so no search of another member, or of none, can match it)."""
    if r.scope.value == "AGENT":
        return "AGENT"
    if r.scope.value == "USER":
        return f"USER/{r.user}" if r.user is not None else "USER\x00none"  # no member: no one's
    return f"SESSION/{r.session}"


def payload_of(r: MemoryRecord | LeanRecord) -> dict[str, Any]:
    # No personal field (summary, content, metadata, key): ids, scope, kind and labels only;
    # the text is in the dense and BM25 vectors, which stay in the index.
    # Every payload key costs ~5 µs to hand to Qdrant, so a point carries only what search
    # filters on, folded into few keys, and the record id; absent flags mean "no". Flags
    # are keyword strings: the Edge bindings turn a Python bool in MatchValue into an
    # integer. `at` is not indexed: only hybrid search reads it back. The memory service
    # breaks score ties once it has the records.
    p: dict[str, Any] = {
        "owner": f"{r.tenant}/{r.agent}",
        "reach": reach_of(r),
        "kind": r.kind,
        "record_id": r.id,
    }
    if r.labels or r.tags:
        p["labels"] = label_terms(r.labels) + tag_terms(r.tags)
    if r.user is not None and r.scope.value != "USER":
        p["member"] = r.user  # made from the member's turn: their erasure finds it (a USER one by "reach")
    if r.preview:
        p["preview"] = "yes"
    # When the fact was said (observed, else recorded): a question naming a time ranks it first.
    p["at"] = int((r.observed_at or r.created).timestamp() * 1000)
    return p


# Keyword payload indexes besides the tenant key "owner". "record_id" is only read back
# (reads by id go to Redis): an index costs every upsert ~6 µs.
KEYWORD_FIELDS = ("reach", "kind", "labels", "preview", "shadowed")
Term = tuple[str, "str | list[str]"]
RecordKey = tuple[str, str, str]  # tenant, agent, record id: what names a point


def erasure_terms(er: Erasure) -> tuple[str, str, list[Term]]:
    """(owner, "value" or "prefix", terms) of the points an erasure removes: the agent's (or,
    for every agent of the tenant, those whose owner starts with the tenant), and when it
    names a member, of them those matching any one of `terms` (one delete each): the member's
    USER records, and the records of other scopes made from their turns."""
    owner = (f"{er.tenant}/{er.agent}", "value") if er.agent is not None else (f"{er.tenant}/", "prefix")
    terms: list[Term] = [] if er.user is None else [("reach", f"USER/{er.user}"), ("member", er.user)]
    return *owner, terms


def filter_terms(f: SearchFilter) -> tuple[list[Term], list[Term]]:
    """(must, must_not) conditions of a search, each a key and a value or any-of list."""
    reach = (["AGENT"] if "AGENT" in f.scopes else []) + (
        [f"SESSION/{f.session}"] if "SESSION" in f.scopes and f.session else []
    ) + ([f"USER/{f.user}"] if "USER" in f.scopes and f.user else [])
    must: list[Term] = [("owner", f"{f.tenant}/{f.agent}"), ("reach", reach or ["\x00none"])]
    if f.kind:
        must.append(("kind", f.kind))
    if f.kinds:
        must.append(("kind", list(f.kinds)))
    must += [("labels", f"{k}={v}") for k, v in f.labels] + [("labels", t) for t in tag_terms(f.tags)]
    if f.ids:
        must.append(("record_id", list(f.ids)))
    # A preview turn sees previews but not the live records they shadow; a live turn no previews.
    must_not: list[Term] = [("shadowed", "yes") if f.preview else ("preview", "yes")]
    if f.not_kinds:
        must_not.append(("kind", list(f.not_kinds)))
    return must, must_not


def fuse(lexical: list[Hit], dense: list[Hit], window: tuple[int, int] | None = None) -> list[Hit]:
    """A hybrid search's two lists as one, fused by score (`projections.qdrant.ranking.fused`; a
    record stands alone, so no neighbour lifts it), a record said inside the `window` the
    question names lifted (`ranking.TIME_WEIGHT`). Rank-only RRF buried a record far ahead in
    one list: see docs/decisions/0019-history-ranking-score-fusion.md for both on LoCoMo."""
    scores = ranking.fused_keys({h.record_id: h.score for h in lexical}, {h.record_id: h.score for h in dense},
                                at={h.record_id: h.at for h in (*lexical, *dense)}, window=window)
    return [Hit(k, v) for k, v in scores.items()]


def hits_of(points: Sequence[Any]) -> list[Hit]:
    """Hits of points read with `record_id` (and `at`, where a hybrid search reads it)."""
    return [Hit(p.payload["record_id"], p.score, p.payload.get("at", -1)) for p in points]


HIT_FIELDS = ["record_id", "at"]  # what a hybrid search reads of each point


def rank(hits: list[Hit], limit: int) -> list[Hit]:
    """The best `limit` hits by score, and any tied with the last of them: a point keeps no
    age, so the caller breaks ties once it has the records (newer first) and cuts."""
    hits.sort(key=lambda h: -round(h.score, 9))
    if len(hits) <= limit or limit <= 0:
        return hits[:max(limit, 0)]
    last = round(hits[limit - 1].score, 9)
    end = limit
    while end < len(hits) and round(hits[end].score, 9) == last:
        end += 1
    return hits[:end]


class EdgeIndex:
    """Owns one Edge shard directory. An Edge shard belongs to one process."""

    def __init__(self, path: Path, dim: int = 384) -> None:
        self.path = Path(path)
        self.bm25 = Bm25(Bm25Config())
        self._lock = threading.Lock()
        self._closed = False
        self.shard = open_shard(self.path, dim, "owner", KEYWORD_FIELDS)

    # ------------------------------------------------------------------ write side

    def upsert(self, items: list[tuple[MemoryRecord, Sequence[float]]]) -> None:
        points = [
            Point(point_id(r.tenant, r.agent, r.id), {DENSE: vec, SPARSE: self.bm25.embed_document(r.text)},
                  payload_of(r))
            for r, vec in items
        ]
        if points:
            with self._lock:
                self.shard.update(UpdateOperation.upsert_points(points))

    def delete(self, keys: list[RecordKey]) -> None:
        if keys:
            with self._lock:
                self.shard.update(UpdateOperation.delete_points([point_id(*k) for k in keys]))

    def purge(self, er: Erasure) -> None:
        """Removes every point of an erased subject (`Erasure`)."""
        owner, how, terms = erasure_terms(er)
        must = [FieldCondition("owner", match=MatchValue(owner) if how == "value" else MatchPrefix(owner))]
        with self._lock:
            for term in terms or [None]:
                extra = [] if term is None else [FieldCondition(term[0], match=MatchValue(term[1]))]
                self.shard.update(UpdateOperation.delete_points_by_filter(Filter(must=must + extra)))

    def set_shadowed(self, tenant: str, agent: str, record_id: str, shadowed: bool) -> None:
        """A preview record that replaces or deletes a live one hides it from preview turns."""
        with self._lock:
            flag = "yes" if shadowed else "no"
            self.shard.update(UpdateOperation.set_payload([point_id(tenant, agent, record_id)], {"shadowed": flag}))

    def optimize(self) -> None:
        """Build the per-agent HNSW graphs and merge segments: slow, offline work."""
        with self._lock:
            self.shard.optimize()

    def flush(self) -> None:
        with self._lock:
            self.shard.flush()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.shard.flush()
            self.shard.close()

    def count(self) -> int:
        return self.shard.info().points_count

    def record_ids(self, tenant: str, agent: str) -> set[str]:
        """The record ids of an agent's points, a page at a time: what a reconciler
        compares with the record view."""
        flt = Filter(must=[FieldCondition("owner", match=MatchValue(f"{tenant}/{agent}"))])
        ids: set[str] = set()
        offset = None
        while True:
            req = ScrollRequest(offset=offset, limit=SCROLL_PAGE, filter=flt,
                                with_payload=PayloadSelector.Include(["record_id"]), with_vector=False)
            with self._lock:
                points, offset = self.shard.scroll(req)
            ids.update(p.payload["record_id"] for p in points)
            if offset is None:
                return ids

    # ------------------------------------------------------------------ read side

    def vectors(self, tenant: str, agent: str, ids: list[str]) -> dict[str, list[float]]:
        """The dense vectors of those of the agent's records that are points (its live ones)."""
        got: dict[str, list[float]] = {}
        for at in range(0, len(ids), SCROLL_PAGE):
            with self._lock:
                points = self.shard.retrieve([point_id(tenant, agent, i) for i in ids[at:at + SCROLL_PAGE]],
                                             PayloadSelector.Include(["record_id"]), [DENSE])
            got.update((p.payload["record_id"], p.vector[DENSE]) for p in points)
        return got

    @staticmethod
    @functools.lru_cache(maxsize=4096)
    def _filter(f: SearchFilter) -> Filter:
        """Kept per search filter: an agent's searches repeat a few, and building the engine's
        conditions cost a few percent of the API's CPU under extraction."""
        def cond(key: str, value: str | list[str]) -> FieldCondition:
            return FieldCondition(key, match=MatchAny(value) if isinstance(value, list) else MatchValue(value))

        must, must_not = filter_terms(f)
        return Filter(must=[cond(*t) for t in must], must_not=[cond(*t) for t in must_not])

    def search(
        self,
        f: SearchFilter,
        dense: list[float] | None,
        text: str,
        limit: int,
        mode: Mode = "hybrid",
        min_score: float = 0.0,
        window: tuple[int, int] | None = None,
    ) -> list[Hit]:
        flt = self._filter(f)
        depth = max(limit * 4, 20)
        sparse = self.bm25.embed_query(text)
        if mode == "lexical":
            req = QueryRequest(limit=depth, query=Query.Nearest(sparse, using=SPARSE), filter=flt, with_payload=True)
        elif mode == "vector":
            req = QueryRequest(
                limit=depth,
                query=Query.Nearest(dense, using=DENSE),
                filter=flt,
                with_payload=True,
                score_threshold=min_score,
            )
        else:
            record_id = PayloadSelector.Include(HIT_FIELDS)
            batch = QueryBatchRequest([
                QueryRequest(limit=depth, query=Query.Nearest(sparse, using=SPARSE), filter=flt, with_payload=record_id),
                QueryRequest(limit=depth, query=Query.Nearest(dense, using=DENSE), filter=flt, with_payload=record_id,
                             score_threshold=min_score),
            ])
        with self._lock:
            try:
                lists = self.shard.query_batch(batch) if mode == "hybrid" else [self.shard.query(req)]
            except Exception as e:
                if type(e) is not Exception:
                    raise
                # The Edge bindings raise a bare Exception for a storage or service error.
                raise IndexUnavailable(f"the Qdrant Edge shard at {self.path} could not search") from e
        return rank(fuse(*map(hits_of, lists), window) if mode == "hybrid" else hits_of(lists[0]), limit)


def read_checkpoint(path: Path) -> dict[str, int]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}


def write_checkpoint(path: Path, ckpt: dict[str, int]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(ckpt))
    tmp.replace(path)


def indexable(r: MemoryRecord | LeanRecord) -> bool:
    return r.status is Status.ACTIVE
