"""The vectors the Qdrant projection has read, kept for the records that will join them.

A vector is kept as read and decoded when a record first uses it: a partition can hold
vectors of other shards' agents (when the shard count does not divide the vector partitions)
and of texts no live record has any more. A vector read before its event is held, and the
checkpoint kept behind it, until the event comes; the others are a bounded cache.
"""

from __future__ import annotations

import array
from collections import OrderedDict

import structlog
from aiokafka import TopicPartition

from events.codec import Codec, ContractError
from events.lean import decode_lean_vector
from events.sealing import KeyDestroyed, KeyMissing
from workers.runtime.topic_reader import TopicReader

log = structlog.get_logger()


class VectorCache:
    """The vectors part of `QdrantProjection`, which sets this state up."""

    codec: Codec  # opens sealed vectors
    model_id: str  # must match the embedder's model id, or no vector ever joins a record
    vectors: OrderedDict[str, array.array | bytes]  # content hash -> the vector, decoded once used
    # Vectors read before their event (content hash -> partition, offset): never
    # evicted, so no record is stranded.
    unused: dict[str, tuple[str, int]]
    # Offsets of those vectors the checkpoint must not pass, per partition, in log order.
    held_vectors: dict[str, OrderedDict[int, None]]
    vector_cache: int | None  # None: keep every vector (a rebuild reads them all first)
    _bound: int | None  # the cache's bound once the vectors-first pass is over
    unreadable: int  # records and vectors sealed under destroyed keys, skipped

    def cached_vector(self, h: str) -> array.array | None:
        return self._vector(h, final=True)

    def _vector(self, h: str, final: bool = False) -> array.array | None:
        """The vector of content hash `h`, decoded (and opened) on first use; None if absent,
        bad or sealed under a destroyed key. Raises `KeyMissing` unless `final`."""
        held = self.vectors.get(h)
        if not isinstance(held, bytes):
            return held
        try:
            msg = decode_lean_vector(held)
            if (msg.model, msg.content_hash) != (self.model_id, h):
                raise ContractError("content_hash", f"the message key names {self.model_id}/{h}, the value "
                                    f"{msg.model}/{msg.content_hash}")
            vec = msg.floats(self.codec.cipher)
        except ContractError as err:
            # Records wait for a good vector; the embedding worker owns its DLQ.
            log.warning("projection_skipped_vector", content_hash=h, error=str(err))
            del self.vectors[h]
            return None
        except (KeyMissing, KeyDestroyed) as err:
            if isinstance(err, KeyMissing) and not final:
                raise
            self.unreadable += 1
            del self.vectors[h]
            return None
        self.vectors[h] = vec
        return vec

    def _hold_vector(self, h: str, part: str, offset: int) -> None:
        if (prev := self.unused.get(h)) is not None:  # the same vector again: keep the later copy
            self.held_vectors[prev[0]].pop(prev[1], None)
        self.unused[h] = (part, offset)
        self.held_vectors.setdefault(part, OrderedDict())[offset] = None

    def _release_vectors(self) -> None:
        """Every event written so far has been read: no record needs a held vector."""
        if self.unused:
            self.unused.clear()
            self.held_vectors.clear()

    async def _pace_vectors(self, c: TopicReader, vector_tps: list[TopicPartition],
                            event_tps: list[TopicPartition]) -> None:
        """Join in bounded memory: a vector read before its event is kept until the event
        comes; when too many wait, vectors pause until the events catch up. Events never
        pause, so this cannot deadlock."""
        behind = [tp for tp in event_tps if (c.last_stable_offset(tp) or 0) > await c.position(tp)]
        if not behind:
            self._release_vectors()  # every written event has been read: these are plain cache entries
        assert self.vector_cache is not None  # the caller paces only with a bounded cache
        if behind and len(self.unused) >= self.vector_cache:
            c.pause(*vector_tps)
        else:
            c.resume(*vector_tps)
        self._trim_cache()

    def _trim_cache(self) -> None:
        assert self.vector_cache is not None  # both callers have a bounded cache
        excess = len(self.vectors) - len(self.unused) - self.vector_cache
        if excess <= 0:
            return
        for h in [h for h in self.vectors if h not in self.unused][:excess]:
            del self.vectors[h]

    def _bound_cache(self) -> None:
        if self.vector_cache is None and self._bound is not None:
            self.vector_cache = self._bound
            self._release_vectors()
            self._trim_cache()
