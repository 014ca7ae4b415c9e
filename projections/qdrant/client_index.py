"""qdrant-client adapter of the vector-index port: a Qdrant server (QDRANT_URL), or
qdrant-client's local mode (a protocol check where no server is reachable). Same points,
payload and ranking as `EdgeIndex`, so the same projection and search code runs on either.

`Collections` is a deployment's set of memory collections on a server: one per generation
and shard (`{prefix}memory-g{N}-s{k}`), and an alias per shard (`{prefix}memory-s{k}`) that
names the live generation and is swapped for every shard in one call. Local mode locks its
storage directory to one process, while `serve` and a rebuild's shard processes each hold
collections at once, so there each collection has a directory of its own and a catalog
directory stands in for the server's namespace: an empty stand-in collection per memory
collection, and the aliases, opened only for the moment of a call (docs/operations/qdrant-server.md).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from qdrant_client import QdrantClient, models
from qdrant_client.http.exceptions import ApiException, ResponseHandlingException
from qdrant_client.local.qdrant_local import QdrantLocal

from events.record import MemoryRecord
from projections.qdrant.index import (
    DENSE,
    HIT_FIELDS,
    KEYWORD_FIELDS,
    SCROLL_PAGE,
    SPARSE,
    Hit,
    IndexUnavailable,
    Mode,
    RecordKey,
    SearchFilter,
    erasure_terms,
    filter_terms,
    fuse,
    hits_of,
    payload_of,
    point_id,
    rank,
)
from projections.records import Erasure

# Every field a search filters on (`filter_terms`) has a payload index on a server, so a
# cluster in strict mode (unindexed filtering refused) still answers. Unlike Edge, "record_id"
# is indexed too: a search by ids filters on it, and a server's upsert cost is the network's.
CLIENT_KEYWORD_FIELDS = (*KEYWORD_FIELDS, "record_id")


def create_collection(client: QdrantClient, collection: str, dim: int = 384) -> None:
    """The collection with its vectors and payload indexes, unless it exists (another process
    may create it at the same moment: that one wins)."""
    if client.collection_exists(collection):
        return
    if isinstance(getattr(client, "_client", None), QdrantLocal):
        # Local mode warns that payload indexes do nothing there: known, and the calls are the protocol check.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return _create(client, collection, dim)
    return _create(client, collection, dim)


def _create(client: QdrantClient, collection: str, dim: int) -> None:
    try:
        client.create_collection(
            collection,
            vectors_config={DENSE: models.VectorParams(size=dim, distance=models.Distance.COSINE)},
            sparse_vectors_config={SPARSE: models.SparseVectorParams(modifier=models.Modifier.IDF)},
            hnsw_config=models.HnswConfigDiff(m=0, payload_m=16),  # as EdgeIndex: a graph per agent
        )
    except (ApiException, ValueError):
        if client.collection_exists(collection):
            return
        raise
    # The tenant index: a tenant's points are stored together and get an HNSW graph of their
    # own; `prefix` serves the erasure of every agent of a tenant (a prefix match on owner).
    client.create_payload_index(
        collection, "owner",
        models.KeywordIndexParams(type=models.KeywordIndexType.KEYWORD, is_tenant=True, enable_hnsw=True, prefix=True),
        wait=True,
    )
    for f in CLIENT_KEYWORD_FIELDS:
        client.create_payload_index(
            collection, f, models.KeywordIndexParams(type=models.KeywordIndexType.KEYWORD, enable_hnsw=False), wait=True
        )


class ClientIndex:
    """One collection. `path` names where the projection keeps its checkpoint
    (`{path}.checkpoint.json` beside it): in local mode the collection's own directory."""

    def __init__(self, client: QdrantClient, collection: str, dim: int = 384, path: Path | None = None) -> None:
        from qdrant_edge import Bm25, Bm25Config

        self.client = client
        self.collection = collection
        self.path = Path(path) if path is not None else Path(collection)
        if path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.bm25 = Bm25(Bm25Config())
        # Local mode is one in-process store that searches (API threads), the projection's
        # writer thread and the reconciler share; a server takes concurrent calls itself.
        self._lock: Any = threading.Lock() if isinstance(getattr(client, "_client", None), QdrantLocal) \
            else contextlib.nullcontext()
        create_collection(client, collection, dim)

    @classmethod
    def connect(cls, url: str | None, collection: str, path: str | None = None, api_key: str | None = None,
                state: Path | None = None) -> ClientIndex:
        """A server's collection (`url`), or local mode's in `path` (its own directory), or in memory."""
        if url:
            return cls(QdrantClient(url=url, api_key=api_key or None), collection, path=state)
        if path:
            client = QdrantClient(path=path, force_disable_check_same_thread=True)
            return cls(client, collection, path=Path(path))
        return cls(QdrantClient(":memory:", force_disable_check_same_thread=True), collection)

    def _sparse(self, sv: Any) -> models.SparseVector:
        return models.SparseVector(indices=list(sv.indices), values=list(sv.values))

    def upsert(self, items: list[tuple[MemoryRecord, list[float]]]) -> None:
        if not items:
            return
        points = [
            models.PointStruct(
                id=point_id(r.tenant, r.agent, r.id),
                vector={DENSE: list(vec), SPARSE: self._sparse(self.bm25.embed_document(r.text))},
                payload=payload_of(r),
            )
            for r, vec in items
        ]
        with self._lock:
            self.client.upsert(self.collection, points, wait=True)

    def delete(self, keys: list[RecordKey]) -> None:
        # wait=True here and below: the projection tells waiters a write is searchable once it returns.
        if keys:
            with self._lock:
                self.client.delete(self.collection, models.PointIdsList(points=[point_id(*k) for k in keys]), wait=True)

    def purge(self, er: Erasure) -> None:
        owner, how, terms = erasure_terms(er)
        match = models.MatchValue(value=owner) if how == "value" else models.MatchPrefix(prefix=owner)
        must = [models.FieldCondition(key="owner", match=match)]
        with self._lock:
            for term in terms or [None]:
                extra = [] if term is None else [models.FieldCondition(key=term[0], match=models.MatchValue(value=term[1]))]
                self.client.delete(self.collection, models.FilterSelector(filter=models.Filter(must=must + extra)),
                                   wait=True)

    def set_shadowed(self, tenant: str, agent: str, record_id: str, shadowed: bool) -> None:
        with self._lock:
            self.client.set_payload(self.collection, {"shadowed": "yes" if shadowed else "no"},
                                    [point_id(tenant, agent, record_id)], wait=True)

    def count(self) -> int:
        with self._lock:
            return self.client.count(self.collection, exact=True).count

    def record_ids(self, tenant: str, agent: str) -> set[str]:
        owner = models.Filter(must=[models.FieldCondition(key="owner", match=models.MatchValue(value=f"{tenant}/{agent}"))])
        ids: set[str] = set()
        offset = None
        while True:
            with self._lock:
                points, offset = self.client.scroll(self.collection, scroll_filter=owner, limit=SCROLL_PAGE,
                                                    offset=offset, with_payload=["record_id"], with_vectors=False)
            ids.update(p.payload["record_id"] for p in points)
            if offset is None:
                return ids

    def vectors(self, tenant: str, agent: str, ids: list[str]) -> dict[str, list[float]]:
        """The dense vectors of those of the agent's records that are points (its live ones)."""
        got: dict[str, list[float]] = {}
        for at in range(0, len(ids), SCROLL_PAGE):
            with self._lock:
                points = self.client.retrieve(self.collection, [point_id(tenant, agent, i) for i in ids[at:at + SCROLL_PAGE]],
                                              with_payload=["record_id"], with_vectors=[DENSE])
            got.update((p.payload["record_id"], p.vector[DENSE]) for p in points if p.payload and isinstance(p.vector, dict))
        return got

    def optimize(self) -> None:
        """A server indexes on its own schedule; local mode has no index to build."""

    def flush(self) -> None:
        """Writes are acknowledged durably by the server (wait=True)."""

    def close(self) -> None:
        with self._lock:
            self.client.close()

    def _filter(self, f: SearchFilter) -> models.Filter:
        def cond(key: str, value: str | list[str]) -> models.FieldCondition:
            match = models.MatchAny(any=value) if isinstance(value, list) else models.MatchValue(value=value)
            return models.FieldCondition(key=key, match=match)

        must, must_not = filter_terms(f)
        return models.Filter(must=[cond(*t) for t in must], must_not=[cond(*t) for t in must_not])

    def search(
        self, f: SearchFilter, dense: list[float] | None, text: str, limit: int, mode: Mode = "hybrid",
        min_score: float = 0.0, window: tuple[int, int] | None = None,
    ) -> list[Hit]:
        try:
            with self._lock:
                return self._search(f, dense, text, limit, mode, min_score, window)
        except (ApiException, ResponseHandlingException, OSError) as e:
            raise IndexUnavailable(f"the Qdrant collection {self.collection} could not search") from e
        except RuntimeError as e:  # local mode, closed
            raise IndexUnavailable(f"the local Qdrant collection {self.collection} could not search") from e

    def _search(self, f: SearchFilter, dense: list[float] | None, text: str, limit: int, mode: Mode,
                min_score: float, window: tuple[int, int] | None = None) -> list[Hit]:
        flt = self._filter(f)
        depth = max(limit * 4, 20)
        sparse = self._sparse(self.bm25.embed_query(text))
        if mode == "lexical":
            res = self.client.query_points(self.collection, query=sparse, using=SPARSE, query_filter=flt,
                                           limit=depth, with_payload=True)
        elif mode == "vector":
            res = self.client.query_points(self.collection, query=dense, using=DENSE, query_filter=flt, limit=depth,
                                           with_payload=True, score_threshold=min_score)
        else:
            lexical, nearest = self.client.query_batch_points(self.collection, [
                models.QueryRequest(query=sparse, using=SPARSE, filter=flt, limit=depth, with_payload=HIT_FIELDS),
                models.QueryRequest(query=dense, using=DENSE, filter=flt, limit=depth, with_payload=HIT_FIELDS,
                                    score_threshold=min_score),
            ])
            return rank(fuse(hits_of(lexical.points), hits_of(nearest.points), window), limit)
        return rank(hits_of(res.points), limit)


CATALOG = "catalog"  # local mode: the directory standing in for a server's collections and aliases
CATALOG_WAIT_S = 30.0  # local mode: how long a call waits for another process to let go of the catalog


class Collections:
    """A deployment's memory collections and aliases (module docstring): on the server at
    `url`, or in local mode under `local_root`. `state` is where the projections keep their
    checkpoints for a server's collections (this host's data directory)."""

    def __init__(self, url: str | None, prefix: str, state: Path, local_root: Path | None = None,
                 api_key: str | None = None, dim: int = 384) -> None:
        if not url and local_root is None:
            raise ValueError("a Qdrant server URL or a local-mode directory")
        self.url, self.api_key, self.prefix, self.dim = url or None, api_key or None, prefix, dim
        self.state, self.local_root = Path(state), None if url else Path(local_root)
        self._pattern = re.compile(rf"^{re.escape(prefix)}memory-g(\d+)-s(\d+)$")

    def name(self, generation: int, shard: int) -> str:
        return f"{self.prefix}memory-g{generation}-s{shard}"

    def alias(self, shard: int) -> str:
        return f"{self.prefix}memory-s{shard}"

    @contextlib.contextmanager
    def catalog(self) -> Iterator[QdrantClient]:
        """A client for collection and alias calls: the server's, or the local catalog,
        waited for while another process holds it (each holds it for one call)."""
        if self.local_root is None:
            client = QdrantClient(url=self.url, api_key=self.api_key)
        else:
            deadline = time.monotonic() + CATALOG_WAIT_S
            while True:
                try:
                    client = QdrantClient(path=str(self.local_root / CATALOG))
                    break
                except RuntimeError as e:  # "already accessed by another instance"
                    if "already accessed" not in str(e) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)
        try:
            yield client
        finally:
            client.close()

    def generations(self) -> dict[int, int]:
        """Each generation that has collections, and how many shards it has."""
        with self.catalog() as c:
            names = [col.name for col in c.get_collections().collections]
        shards: dict[int, int] = {}
        for n in names:
            if m := self._pattern.match(n):
                gen, k = int(m.group(1)), int(m.group(2))
                shards[gen] = max(shards.get(gen, 0), k + 1)
        return shards

    def live(self) -> int | None:
        """The generation the aliases name (swapped together, so shard 0's says it), or None."""
        with self.catalog() as c:
            aliases = {a.alias_name: a.collection_name for a in c.get_aliases().aliases}
        m = self._pattern.match(aliases.get(self.alias(0), ""))
        return int(m.group(1)) if m else None

    def ensure(self, generation: int, shards: int) -> int:
        """The generation's shard count, creating `shards` collections if it has none: a
        generation keeps the count it was made with."""
        have = self.generations().get(generation)
        if have:
            return have
        for k in range(shards):
            name = self.name(generation, k)
            if self.local_root is None:
                with self.catalog() as c:
                    create_collection(c, name, self.dim)
            else:
                self.open(generation, k).close()
                with self.catalog() as c:  # the stand-in, that names and aliases it
                    if not c.collection_exists(name):
                        c.create_collection(name, vectors_config={})
        return shards

    def open(self, generation: int, shard: int) -> ClientIndex:
        name = self.name(generation, shard)
        if self.local_root is None:
            return ClientIndex.connect(self.url, name, api_key=self.api_key, state=self.state / name, )
        return ClientIndex.connect(None, name, path=str(self.local_root / name))

    def switch(self, generation: int) -> None:
        """Points every shard's alias at `generation` in one call, and drops aliases of shards
        it does not have: readers see the old generation or the new one, never a mix."""
        shards = self.generations().get(generation, 0)
        if not shards:
            raise ValueError(f"qdrant generation {generation} has no collections")
        with self.catalog() as c:
            have = {a.alias_name for a in c.get_aliases().aliases}
            ops: list[Any] = [models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=a))
                              for a in sorted(have) if re.fullmatch(rf"{re.escape(self.prefix)}memory-s\d+", a)]
            ops += [models.CreateAliasOperation(create_alias=models.CreateAlias(
                collection_name=self.name(generation, k), alias_name=self.alias(k))) for k in range(shards)]
            c.update_collection_aliases(change_aliases_operations=ops)

    def drop(self, generation: int) -> None:
        """A generation's collections, and the checkpoints kept for them."""
        for k in range(self.generations().get(generation, 0)):
            name = self.name(generation, k)
            with self.catalog() as c:
                c.delete_collection(name)
            where = self.state if self.local_root is None else self.local_root
            if self.local_root is not None:
                shutil.rmtree(self.local_root / name, ignore_errors=True)
            (where / f"{name}.checkpoint.json").unlink(missing_ok=True)
