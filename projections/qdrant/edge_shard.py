"""Opening a Qdrant Edge shard the way memlane's projections use one."""

from __future__ import annotations

from pathlib import Path

from qdrant_edge import (
    Distance,
    EdgeConfig,
    EdgeShard,
    EdgeSparseVectorParams,
    EdgeVectorParams,
    HnswIndexConfig,
    KeywordIndexParams,
    Memory,
    Modifier,
    PayloadSchemaType,
    UpdateOperation,
)

DENSE, SPARSE = "dense", "bm25"
# A search runs on the thread that asks, not on a pool of Edge's own: searches already run
# concurrently, one per API worker thread (figures: docs/decisions/0004-qdrant-edge-embedded-index.md).
SEARCH_THREADS = 1
_opened = False


def opened_in_this_process() -> bool:
    """Whether this process has opened a shard, and so started Edge's native threads
    (forking it is then unsafe: see `workers.jobs.rebuild`)."""
    return _opened


def open_shard(
    path: Path,
    dim: int,
    tenant_key: str,
    keywords: tuple[str, ...] = (),
    integers: tuple[str, ...] = (),
) -> EdgeShard:
    """Loads the shard at `path`, or creates it: dense + BM25 vectors and payload indexes.

    Every search filters on `tenant_key`, so there is no global graph (m=0) and optimize()
    builds one graph per tenant large enough to need one (Qdrant's multitenancy recipe);
    other fields are plain payload lookups inside a tenant's points. There is no WAL: the
    log is the shard's write-ahead log, and each projection writes its checkpoint only
    after flush(), so a crash replays from there (a WAL cost ~15% of every upsert).
    """
    global _opened
    _opened = True
    path.mkdir(parents=True, exist_ok=True)
    config = EdgeConfig(
        vectors={DENSE: EdgeVectorParams(size=dim, distance=Distance.Cosine)},
        sparse_vectors={SPARSE: EdgeSparseVectorParams(modifier=Modifier.Idf)},
        wal_enabled=False,
        payload_memory=Memory.Cached,
        hnsw_config=HnswIndexConfig(m=0, ef_construct=100, full_scan_threshold=10_000, payload_m=16),
        max_search_threads=SEARCH_THREADS,
    )
    if (path / "edge_config.json").exists():
        # The config is passed again so that a shard made before a setting changed gets it.
        return EdgeShard.load(str(path), config)
    shard = EdgeShard.create(str(path), config)
    shard.update(UpdateOperation.create_field_index(tenant_key, KeywordIndexParams(is_tenant=True, enable_hnsw=True)))
    for f in keywords:
        shard.update(UpdateOperation.create_field_index(f, KeywordIndexParams(enable_hnsw=False)))
    for f in integers:
        shard.update(UpdateOperation.create_field_index(f, PayloadSchemaType.Integer))
    return shard
