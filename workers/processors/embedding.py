"""Puts the vector of each ACTIVE record version on the compacted `memlane.vectors`.

Keyed by model and content hash, so the Qdrant projection and every rebuild join
events with vectors instead of embedding again. Each goes to the partition beside its
record's agents (`vector_partition`), so a memory shard reads only its own. A text is
embedded once per subject; its vector is re-sent for each later version that needs it,
so the projection never waits on a vector that went by long ago. Compaction keeps one
copy per partition.

A vector belongs to its record's subject: its content hash is keyed by the subject's data
key and its dense vector sealed under it (`events.vectors`). When a subject is erased
(`SubjectErased`), its vectors are tombstoned: found by the subject they name, in the
vector partitions the erasure reaches.

Session history's vectors are `workers.processors.history_embedding`'s, a companion in this process
with its own consumer group and transactions: a turn's parts then never hold up the vector
of the record it caused, which search waits for.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

import structlog
from aiokafka import TopicPartition

from events.codec import Codec
from events.lean import decode_lean, decode_lean_vector
from events.record import Status
from events.topics import EVENTS, VECTORS, Topic, vector_partition
from events.vectors import VectorComputed
from projections.embedders.port import Embedder
from projections.records import Erasure, erasure_at
from workers.runtime.metrics import MeteredEmbedder
from workers.runtime.runner import Out, Processor
from workers.runtime.topic_reader import TopicReader
from workers.runtime.tracing import processing

log = structlog.get_logger()
CACHE = 20_000  # vectors kept for texts seen lately


class EmbeddingProcessor(Processor):
    name = "embedding"
    sources = (EVENTS.name,)

    def __init__(self, settings, embedder: Embedder, *, codec: Codec) -> None:
        super().__init__(settings, codec=codec)
        # it keeps its own cache; metered: memlane_embedding_* with caller="worker" (docs/reference/metrics.md)
        self.embedder = MeteredEmbedder(embedder, "worker")
        # content hash -> (subject, vector): the hash is the subject's, so a text is embedded
        # once per subject, never shared with another.
        self.cache: OrderedDict[str, tuple[str | None, list[float]]] = OrderedDict()
        # (hash, vector partition) -> (text, subject, the trace its vector carries on)
        self.todo: dict[tuple[str, int], tuple[str, str | None, tuple[tuple[str, bytes], ...]]] = {}
        self.erased: list[tuple[Erasure, int]] = []  # (erasure, the event partition it came on)

    def decode_message(self, source: str, message: Any) -> Any:
        # Lean: the record stays sealed until it is embedded, and its token names the key
        # its vector's hash is keyed by.
        return decode_lean(message.value)

    async def process(self, source: str, partition: int, offset: int, event: Any) -> list[Out]:
        r = event.record
        if r is not None and r.status is Status.ACTIVE:
            # Raises KeyMissing (the runner catches up and retries) or KeyDestroyed (skipped).
            opened, h, subject = r.vector_of(self.codec.cipher)
            self.todo[h, vector_partition(partition)] = (opened.text, subject, processing())
        elif event.type == "SubjectErased":
            self.erased.append((erasure_at(event.full(self.codec))[0], partition))
        return []

    async def batch_done(self) -> list[Out]:
        """Embed the batch's new texts in one call; the runner sends and commits them, with
        the tombstones of erased subjects' vectors."""
        erased = list(self.erased)
        outs = await self._tombstones() if erased else []
        # A text of a subject erased in this same batch is not embedded: sealed after the
        # erasure's tombstones, under a new key, its vector would outlive them.
        self.todo = {k: v for k, v in self.todo.items()
                     if v[1] is None or not any(er.covers_subject(v[1]) for er, _ in erased)}
        if not self.todo:
            return outs
        new = {h: item for (h, _), item in self.todo.items() if h not in self.cache}
        # In a thread: the history companion's runner shares this loop.
        vecs = await asyncio.to_thread(self.embedder.embed, [t for t, _, _ in new.values()]) if new else []
        for (h, (_, subject, _)), v in zip(new.items(), vecs):
            self.cache[h] = (subject, v)
        sent = 0
        for (h, partition), (_, _, traced) in self.todo.items():
            self.cache.move_to_end(h)
            subject, vec = self.cache[h]
            msg = VectorComputed.of(self.embedder.model_id, h, vec, subject, self.codec.cipher)
            outs.append(Out(VECTORS.name, VECTORS.key_bytes(msg), self.codec.encode(msg), traced, partition=partition))
            sent += 1
        while len(self.cache) > CACHE:
            self.cache.popitem(last=False)
        log.info("vectors_sent", embedded=len(new), sent=sent, model=self.embedder.model_id)
        self.todo = {}
        return outs

    async def _tombstones(self) -> list[Out]:
        """Tombstones for the vectors of the batch's erased subjects: the subject's own vector
        partition (beside its agent), or all of them for an erasure of every agent."""
        erased, self.erased = self.erased, []
        partitions = sorted({p for er, ep in erased
                             for p in (range(VECTORS.partitions) if er.everywhere else [vector_partition(ep)])})
        self.cache = OrderedDict((h, v) for h, v in self.cache.items()
                                 if v[0] is None or not any(er.covers_subject(v[0]) for er, _ in erased))
        outs = await doomed(self.settings, VECTORS, partitions, [er for er, _ in erased])
        if outs:
            log.info("vectors_tombstoned", vectors=len(outs), erasures=len(erased))
        return outs


async def doomed(settings, vectors: Topic, partitions: list[int], erased: list[Erasure]) -> list[Out]:
    """Tombstones for the vectors in `partitions` of `vectors` whose subject an erasure reaches."""
    found: dict[tuple[bytes, int], None] = {}
    topic = settings.topic(vectors.name)
    tps = [TopicPartition(topic, p) for p in partitions]
    async with TopicReader(settings, max_poll_records=5000) as c:
        await c.assign(tps)
        end = await c.ends(tps)
        active = [tp for tp in tps if end[tp] > 0]
        while active:
            for tp, msgs in (await c.poll(*active, timeout_ms=500, max_records=5000)).items():
                for m in msgs:
                    if m.offset >= end[tp] or m.key is None:
                        continue
                    if m.value is None:
                        found.pop((m.key, tp.partition), None)  # tombstoned already
                        continue
                    subject = _subject_of(m.value)
                    if subject is not None and any(er.covers_subject(subject) for er in erased):
                        found[m.key, tp.partition] = None
            active = [tp for tp in active if await c.position(tp) < end[tp]]
    return [Out(vectors.name, key, None, partition=p) for key, p in found]  # type: ignore[arg-type]


def _subject_of(value: bytes) -> str | None:
    if b'"subject"' not in value:
        return None
    try:
        return decode_lean_vector(value).subject
    except Exception:  # not a vector this reader can parse: not ours to tombstone
        return None
