"""qdrant-client adapter of the vector-index port: a Qdrant server (QDRANT_URL), or
qdrant-client's local mode for contract tests. Same points, payload and ranking as
`EdgeIndex`, so either can serve search."""

from __future__ import annotations

from typing import Any

from qdrant_client import QdrantClient, models
from qdrant_client.http.exceptions import ApiException, ResponseHandlingException

from events.record import MemoryRecord
from projections.qdrant_index import (
    DENSE,
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
    payload_of,
    point_id,
    rank,
)
from projections.records import Erasure


class ClientIndex:
    def __init__(self, client: QdrantClient, collection: str, dim: int = 384) -> None:
        from qdrant_edge import Bm25, Bm25Config

        self.client = client
        self.collection = collection
        self.bm25 = Bm25(Bm25Config())
        if not client.collection_exists(collection):
            client.create_collection(
                collection,
                vectors_config={DENSE: models.VectorParams(size=dim, distance=models.Distance.COSINE)},
                sparse_vectors_config={SPARSE: models.SparseVectorParams(modifier=models.Modifier.IDF)},
                hnsw_config=models.HnswConfigDiff(m=0, payload_m=16),  # as EdgeIndex: a graph per agent
            )
            client.create_payload_index(
                collection,
                "owner",
                models.KeywordIndexParams(type=models.KeywordIndexType.KEYWORD, is_tenant=True, enable_hnsw=True),
            )
            for f in KEYWORD_FIELDS:
                client.create_payload_index(
                    collection, f, models.KeywordIndexParams(type=models.KeywordIndexType.KEYWORD, enable_hnsw=False)
                )

    @classmethod
    def connect(cls, url: str | None, collection: str, path: str | None = None) -> ClientIndex:
        client = QdrantClient(url=url) if url else QdrantClient(path=path) if path else QdrantClient(":memory:")
        return cls(client, collection)

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
        self.client.upsert(self.collection, points, wait=True)

    def delete(self, keys: list[RecordKey]) -> None:
        if keys:
            self.client.delete(self.collection, models.PointIdsList(points=[point_id(*k) for k in keys]))

    def purge(self, er: Erasure) -> None:
        owner, how, reach = erasure_terms(er)
        match = models.MatchValue(value=owner) if how == "value" else models.MatchPrefix(prefix=owner)
        must = [models.FieldCondition(key="owner", match=match)]
        if reach is not None:
            must.append(models.FieldCondition(key="reach", match=models.MatchValue(value=reach)))
        self.client.delete(self.collection, models.FilterSelector(filter=models.Filter(must=must)), wait=True)

    def set_shadowed(self, tenant: str, agent: str, record_id: str, shadowed: bool) -> None:
        self.client.set_payload(self.collection, {"shadowed": "yes" if shadowed else "no"},
                                [point_id(tenant, agent, record_id)])

    def count(self) -> int:
        return self.client.count(self.collection, exact=True).count

    def record_ids(self, tenant: str, agent: str) -> set[str]:
        owner = models.Filter(must=[models.FieldCondition(key="owner", match=models.MatchValue(value=f"{tenant}/{agent}"))])
        ids: set[str] = set()
        offset = None
        while True:
            points, offset = self.client.scroll(self.collection, scroll_filter=owner, limit=SCROLL_PAGE, offset=offset,
                                                with_payload=["record_id"], with_vectors=False)
            ids.update(p.payload["record_id"] for p in points)
            if offset is None:
                return ids

    def optimize(self) -> None:
        """A server indexes on its own schedule; local mode has no index to build."""

    def flush(self) -> None:
        """Writes are acknowledged durably by the server (wait=True)."""

    def close(self) -> None:
        self.client.close()

    def _filter(self, f: SearchFilter) -> models.Filter:
        def cond(key: str, value: str | list[str]) -> models.FieldCondition:
            match = models.MatchAny(any=value) if isinstance(value, list) else models.MatchValue(value=value)
            return models.FieldCondition(key=key, match=match)

        must, must_not = filter_terms(f)
        return models.Filter(must=[cond(*t) for t in must], must_not=[cond(*t) for t in must_not])

    def search(
        self, f: SearchFilter, dense: list[float] | None, text: str, limit: int, mode: Mode = "hybrid",
        min_score: float = 0.0,
    ) -> list[Hit]:
        try:
            return self._search(f, dense, text, limit, mode, min_score)
        except (ApiException, ResponseHandlingException, OSError) as e:
            raise IndexUnavailable(f"the Qdrant collection {self.collection} could not search") from e
        except RuntimeError as e:  # local mode, closed
            raise IndexUnavailable(f"the local Qdrant collection {self.collection} could not search") from e

    def _search(self, f: SearchFilter, dense: list[float] | None, text: str, limit: int, mode: Mode,
                min_score: float) -> list[Hit]:
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
            res = self.client.query_points(
                self.collection,
                prefetch=[
                    models.Prefetch(query=dense, using=DENSE, filter=flt, limit=depth, score_threshold=min_score),
                    models.Prefetch(query=sparse, using=SPARSE, filter=flt, limit=depth),
                ],
                query=models.RrfQuery(rrf=models.Rrf(k=60)),
                limit=depth,
                with_payload=True,
            )
        return rank([Hit(p.payload["record_id"], p.score) for p in res.points], limit)
