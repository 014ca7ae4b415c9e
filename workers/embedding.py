"""Puts the vector of each ACTIVE record version on the compacted `memlane.vectors`.

Keyed by model and content hash, so the Qdrant projection and every rebuild join
events with vectors instead of embedding again. Each goes to the partition beside its
record's agents (`vector_partition`), so a memory shard reads only its own. A text is
embedded once; its vector is re-sent (same key, same value) for each later version that
needs it, so the projection never waits on a vector that went by long ago. Compaction
keeps one copy per partition.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import structlog

from events.codec import encode
from events.memory import RECORD_EVENTS
from events.record import Status
from events.topics import EVENTS, VECTORS, vector_partition
from events.vectors import VectorComputed
from projections.embedders import make_embedder
from projections.embedding_port import content_hash
from workers.runtime import Out, Processor

log = structlog.get_logger()


class EmbeddingWorker(Processor):
    name = "embedding"
    sources = (EVENTS.name,)

    def __init__(self, settings, embedder=None) -> None:
        super().__init__(settings)
        self.embedder = embedder or make_embedder(settings, cache_size=0)  # it keeps its own cache
        self.cache: OrderedDict[str, list[float]] = OrderedDict()
        self.todo: dict[tuple[str, int], str] = {}  # (content hash, vector partition) -> text

    async def process(self, source: str, partition: int, offset: int, event: Any) -> list[Out]:
        if isinstance(event, RECORD_EVENTS) and event.record.status is Status.ACTIVE:
            text = event.record.text
            self.todo[content_hash(text), vector_partition(partition)] = text
        return []

    async def batch_done(self) -> list[Out]:
        """Embed the batch's new texts in one call; the runner sends and commits them."""
        if not self.todo:
            return []
        new = {h: t for (h, _), t in self.todo.items() if h not in self.cache}
        for h, v in zip(new, self.embedder.embed(list(new.values()))):
            self.cache[h] = v
        outs = []
        for h, partition in self.todo:
            self.cache.move_to_end(h)
            msg = VectorComputed.of(self.embedder.model_id, h, self.cache[h])
            outs.append(Out(VECTORS.name, VECTORS.key_bytes(msg), encode(msg), partition=partition))
        while len(self.cache) > 20_000:
            self.cache.popitem(last=False)
        log.info("vectors_sent", embedded=len(new), sent=len(outs), model=self.embedder.model_id)
        self.todo = {}
        return outs
