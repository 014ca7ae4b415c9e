"""When a memory shard's Qdrant Edge index wants optimising (docs/operations/scheduled-jobs.md).

Each point carries a dense vector and a BM25 sparse vector. Edge's `indexed_vectors_count`
counts a sparse vector as indexed always (its inverted index is built on write) and a dense
vector once an optimise has put its segment under an HNSW graph; points written since sit in
the appendable segment, searched by a full scan. So a shard's unindexed points are
`2 * points - indexed_vectors`.

An optimise leaves small segments as they are (below Edge's indexing threshold a full scan is
as fast as a graph), so a small shard stays "unindexed" after one. The optimise therefore
writes what it left unindexed beside each shard (`LEFT`), and only what came since counts
towards the threshold; a shard never optimised left nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

LEFT = "UNINDEXED"  # in a shard's directory: unindexed points its optimise left


def unindexed_points(points: int, indexed_vectors: int) -> int:
    """Points whose dense vector is in no HNSW graph (module docstring)."""
    return max(0, 2 * points - indexed_vectors)


def optimize_due(unindexed: Sequence[int], left: Sequence[int], threshold: int) -> bool:
    """Whether any shard has `threshold` or more unindexed points beyond what its last
    optimise left (`left`, per shard in the same order); never with `threshold` 0."""
    return threshold > 0 and any(u - lo >= threshold for u, lo in zip(unindexed, left))


def shard_unindexed(index: Any) -> int:
    """A shard's unindexed points (`projections.qdrant.index.EdgeIndex`)."""
    info = index.shard.info()
    return unindexed_points(info.points_count, info.indexed_vectors_count)


def read_left(shard_dir: Path) -> int:
    try:
        return int((Path(shard_dir) / LEFT).read_text())
    except (FileNotFoundError, ValueError):
        return 0


def write_left(shard_dir: Path, n: int) -> None:
    tmp = Path(shard_dir) / f"{LEFT}.tmp"
    tmp.write_text(str(n))
    tmp.replace(Path(shard_dir) / LEFT)
