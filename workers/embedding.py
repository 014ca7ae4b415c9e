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

It also reads `memlane.turns` and embeds session history: each part of a committed turn's
kept events (`events.rules.history`, the rules the history projection folds by) goes to the
compacted `memlane.history.vectors`, named by its point id and sealed under its turn's
subject, in its turn's partition. The API's history projection only joins and indexes
them, so more workers in this group share history's embedding, and a history rebuild
embeds nothing (docs/history-path.md). A rolled-back attempt keeps nothing, so it has no
vector; an erasure tombstones the subject's history vectors too, and a turn from before an
erasure this worker has seen is not embedded.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

import structlog
from aiokafka import TopicPartition

from events.codec import cipher, decode, encode
from events.lean import decode_lean, decode_lean_vector
from events.record import Status
from events.rules.history import erased, erasure_marker, kept_events, parts_of
from events.sealing import subject_of
from events.topics import EVENTS, HISTORY_VECTORS, TURNS, VECTORS, Topic, vector_partition
from events.turns import TurnCommitted
from events.vectors import VectorComputed
from projections.embedders import make_embedder
from projections.records import Erasure
from workers.history import erasure_at
from workers.metrics import MeteredEmbedder
from workers.runtime import Out, Processor
from workers.topic_reader import TopicReader

log = structlog.get_logger()
CACHE = 20_000  # vectors kept for texts seen lately


class EmbeddingWorker(Processor):
    name = "embedding"
    sources = (EVENTS.name, TURNS.name)

    def __init__(self, settings, embedder=None) -> None:
        super().__init__(settings)
        # it keeps its own cache; metered: memlane_embedding_* with caller="worker" (docs/metrics.md)
        self.embedder = MeteredEmbedder(embedder or make_embedder(settings, cache_size=0), "worker")
        # content hash -> (subject, vector): the hash is the subject's, so a text is embedded
        # once per subject, never shared with another.
        self.cache: OrderedDict[str, tuple[str | None, list[float]]] = OrderedDict()
        self.todo: dict[tuple[str, int], tuple[str, str | None]] = {}  # (hash, vector partition) -> (text, subject)
        self.erased: list[tuple[Erasure, int]] = []  # (erasure, the event partition it came on)
        # (point id, turn partition) -> (text, subject): the batch's history parts to embed.
        self.parts: dict[tuple[str, int], tuple[str, str]] = {}
        # Erasure markers seen (events.rules.history.erased): a turn folded after one, from
        # before it, is not embedded again under its member's new key.
        self.erased_at: dict[str, int] = {}

    def decode_message(self, source: str, message: Any) -> Any:
        if source == TURNS.name:
            return decode(source, message.value)  # the platform's turns are plaintext
        # Lean: the record stays sealed until it is embedded, and its token names the key
        # its vector's hash is keyed by.
        return decode_lean(message.value)

    async def process(self, source: str, partition: int, offset: int, event: Any) -> list[Out]:
        if source == TURNS.name:
            if isinstance(event, TurnCommitted):  # a rollback or a session's end keeps nothing
                for e in kept_events(event):
                    if not erased(self.erased_at, e):
                        subject = subject_of(e.tenant, e.agent, e.user)
                        for pid, _, _, text in parts_of(e):
                            self.parts[pid, partition] = (text, subject)
            return []
        r = event.record
        if r is not None and r.status is Status.ACTIVE:
            # Raises KeyMissing (the runner catches up and retries) or KeyDestroyed (skipped).
            opened, h, subject = r.vector_of()
            self.todo[h, vector_partition(partition)] = (opened.text, subject)
        elif event.type == "SubjectErased":
            er, at = erasure_at(event.full())
            self.erased.append((er, partition))
            marker = erasure_marker(er.tenant, er.agent, er.user)
            self.erased_at[marker] = max(at, self.erased_at.get(marker, -1))
        return []

    async def batch_done(self) -> list[Out]:
        """Embed the batch's new texts in one call; the runner sends and commits them, with
        the tombstones of erased subjects' vectors."""
        erased = list(self.erased)
        outs = await self._tombstones() if erased else []
        if self.parts:
            outs += await self._history_vectors()
        # A text of a subject erased in this same batch is not embedded: sealed after the
        # erasure's tombstones, under a new key, its vector would outlive them.
        self.todo = {k: v for k, v in self.todo.items()
                     if v[1] is None or not any(er.covers_subject(v[1]) for er, _ in erased)}
        if not self.todo:
            return outs
        new = {h: item for (h, _), item in self.todo.items() if h not in self.cache}
        for (h, (_, subject)), v in zip(new.items(), self.embedder.embed([t for t, _ in new.values()])):
            self.cache[h] = (subject, v)
        sent = 0
        for h, partition in self.todo:
            self.cache.move_to_end(h)
            subject, vec = self.cache[h]
            msg = VectorComputed.of(self.embedder.model_id, h, vec, subject, cipher())
            outs.append(Out(VECTORS.name, VECTORS.key_bytes(msg), encode(msg), partition=partition))
            sent += 1
        while len(self.cache) > CACHE:
            self.cache.popitem(last=False)
        log.info("vectors_sent", embedded=len(new), sent=sent, model=self.embedder.model_id)
        self.todo = {}
        return outs

    async def _history_vectors(self) -> list[Out]:
        """The batch's history parts embedded in one call, each distinct text once, in a
        thread: a batch of long messages takes seconds, and the group's heartbeats go on."""
        parts, self.parts = self.parts, {}
        texts = list(dict.fromkeys(text for text, _ in parts.values()))
        by_text = dict(zip(texts, await asyncio.to_thread(self.embedder.embed, texts), strict=True))
        outs = []
        for (pid, partition), (text, subject) in parts.items():
            msg = VectorComputed.of(self.embedder.model_id, pid, by_text[text], subject, cipher())
            outs.append(Out(HISTORY_VECTORS.name, HISTORY_VECTORS.key_bytes(msg), encode(msg), partition=partition))
        log.info("history_vectors_sent", embedded=len(texts), sent=len(outs), model=self.embedder.model_id)
        return outs

    async def _tombstones(self) -> list[Out]:
        """Tombstones for the vectors of the batch's erased subjects: the subject's own vector
        partition (beside its agent), or all of them for an erasure of every agent; and its
        history vectors, in every partition (a subject's sessions spread over them)."""
        erased, self.erased = self.erased, []
        partitions = sorted({p for er, ep in erased
                             for p in (range(VECTORS.partitions) if er.everywhere else [vector_partition(ep)])})
        self.cache = OrderedDict((h, v) for h, v in self.cache.items()
                                 if v[0] is None or not any(er.covers_subject(v[0]) for er, _ in erased))
        outs = await self._doomed(VECTORS, partitions, erased)
        outs += await self._doomed(HISTORY_VECTORS, list(range(HISTORY_VECTORS.partitions)), erased)
        if outs:
            log.info("vectors_tombstoned", vectors=len(outs), erasures=len(erased))
        return outs

    async def _doomed(self, vectors: Topic, partitions: list[int], erased: list[tuple[Erasure, int]]) -> list[Out]:
        """Tombstones for the vectors in `partitions` of `vectors` whose subject an erasure reaches."""
        doomed: dict[tuple[bytes, int], None] = {}
        topic = self.settings.topic(vectors.name)
        tps = [TopicPartition(topic, p) for p in partitions]
        async with TopicReader(self.settings, max_poll_records=5000) as c:
            await c.assign(tps)
            end = await c.ends(tps)
            active = [tp for tp in tps if end[tp] > 0]
            while active:
                for tp, msgs in (await c.poll(*active, timeout_ms=500, max_records=5000)).items():
                    for m in msgs:
                        if m.offset >= end[tp] or m.key is None:
                            continue
                        if m.value is None:
                            doomed.pop((m.key, tp.partition), None)  # tombstoned already
                            continue
                        subject = _subject_of(m.value)
                        if subject is not None and any(er.covers_subject(subject) for er, _ in erased):
                            doomed[m.key, tp.partition] = None
                active = [tp for tp in active if await c.position(tp) < end[tp]]
        return [Out(vectors.name, key, None, partition=p) for key, p in doomed]  # type: ignore[arg-type]


def _subject_of(value: bytes) -> str | None:
    if b'"subject"' not in value:
        return None
    try:
        return decode_lean_vector(value).subject
    except Exception:  # not a vector this reader can parse: not ours to tombstone
        return None
