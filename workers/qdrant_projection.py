"""Folds memory events, joined with their vectors, into the Qdrant index.

In the embedded default the process that serves search owns the Edge shard, so it runs
this projection itself over every partition (Kafka Streams' interactive-queries
pattern). It reads `memlane.vectors` and `memlane.memory.events` and joins them by content
hash: a record whose vector has not arrived yet is parked until it does. It never embeds.
The checkpoint is a file next to the shard, written after the shard is flushed.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition

from events.codec import ContractError, decode
from events.memory import RECORD_EVENTS
from events.record import MemoryRecord, Status
from events.topics import EVENTS, VECTORS
from projections.embedder import MODEL_ID, content_hash
from projections.qdrant_index import EdgeIndex, indexable, read_checkpoint, write_checkpoint
from services.settings import Settings

log = structlog.get_logger()
VECTOR_CACHE = 50_000


class QdrantProjection:
    def __init__(self, settings: Settings, index: EdgeIndex, model_id: str = MODEL_ID) -> None:
        self.settings = settings
        self.index = index
        self.model_id = model_id
        self.ckpt_path = index.path.parent / f"{index.path.name}.checkpoint.json"
        self.ckpt: dict[str, int] = read_checkpoint(self.ckpt_path)
        self.vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self.parked: dict[str, dict[str, MemoryRecord]] = {}
        self.versions: dict[str, int] = {}
        self.waiters: dict[str, list[asyncio.Future]] = {}
        self.done_commands: OrderedDict[str, Any] = OrderedDict()
        # Record id -> (command id, event) of records parked until their vector arrives.
        self.waiting_commands: dict[str, list] = {}
        self._pending_done: list = []
        self.applied = 0
        self.stopping = asyncio.Event()
        self.caught_up = asyncio.Event()

    # ------------------------------------------------------------------ waiting for writes

    def wait_for(self, command_id: str) -> asyncio.Future:
        """Resolves with the command's events once they are searchable (read-your-writes)."""
        fut = asyncio.get_running_loop().create_future()
        if command_id in self.done_commands:
            fut.set_result(self.done_commands[command_id])
        else:
            self.waiters.setdefault(command_id, []).append(fut)
        return fut

    def _command_done(self, command_id: str, event: Any) -> None:
        self.done_commands.setdefault(command_id, []).append(event)
        while len(self.done_commands) > 50_000:
            self.done_commands.popitem(last=False)
        for fut in self.waiters.pop(command_id, []):
            if not fut.done():
                fut.set_result(self.done_commands[command_id])

    # ------------------------------------------------------------------ folding

    def _on_vector(self, msg: Any) -> list[tuple[MemoryRecord, list[float]]]:
        if msg.model != self.model_id:
            return []
        self.vectors[msg.content_hash] = np.asarray(msg.dense, dtype=np.float32)
        self.vectors.move_to_end(msg.content_hash)
        while len(self.vectors) > VECTOR_CACHE:
            self.vectors.popitem(last=False)
        ready = self.parked.pop(msg.content_hash, {})
        return [(r, msg.dense) for r in ready.values()]

    def _on_event(self, e: Any, upserts: list, deletes: list, shadows: list) -> None:
        if not isinstance(e, RECORD_EVENTS):
            self._command_done(e.command_id, e)
            return
        r = e.record
        if r.version <= self.versions.get(r.id, 0):
            self._command_done(e.command_id, e)
            return
        self.versions[r.id] = r.version
        if r.preview and r.replaces:
            shadows.append((r.replaces, True))
        if indexable(r):
            h = content_hash(r.text)
            vec = self.vectors.get(h)
            if vec is None:
                self.parked.setdefault(h, {})[r.id] = r
                self.waiting_commands.setdefault(r.id, []).append((e.command_id, e))
                return
            upserts.append((r, vec.tolist()))
        else:
            deletes.append(r.id)
            for bucket in self.parked.values():
                bucket.pop(r.id, None)
        self._command_done(e.command_id, e)

    async def run(self) -> None:
        s = self.settings
        c = AIOKafkaConsumer(
            bootstrap_servers=s.kafka_bootstrap,
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            max_poll_records=1000,
        )
        await c.start()
        try:
            tps = [TopicPartition(s.topic(EVENTS.name), p) for p in range(EVENTS.partitions)]
            vtps = [TopicPartition(s.topic(VECTORS.name), p) for p in range(VECTORS.partitions)]
            c.assign(tps + vtps)
            for tp in tps + vtps:
                nxt = self.ckpt.get(f"{tp.topic}:{tp.partition}")
                if nxt is None:
                    await c.seek_to_beginning(tp)
                else:
                    c.seek(tp, nxt)
            await self._loop(c, tps)
        finally:
            await c.stop()

    async def _loop(self, c: AIOKafkaConsumer, tps: list[TopicPartition]) -> None:
        s = self.settings
        events_topic, vectors_topic = s.topic(EVENTS.name), s.topic(VECTORS.name)
        end = await c.end_offsets(tps)
        while not self.stopping.is_set():
            batches = await c.getmany(timeout_ms=200, max_records=1000)
            upserts: list = []
            deletes: list = []
            shadows: list = []
            positions: dict[str, int] = {}
            for tp, msgs in batches.items():
                for m in msgs:
                    positions[f"{tp.topic}:{tp.partition}"] = m.offset + 1
                    try:
                        if tp.topic == vectors_topic:
                            for r, vec in self._on_vector(decode(VECTORS.name, m.value)):
                                upserts.append((r, vec))
                                for cid, ev in self.waiting_commands.pop(r.id, []):
                                    self._pending_done.append((cid, ev))
                        elif tp.topic == events_topic:
                            self._on_event(decode(EVENTS.name, m.value), upserts, deletes, shadows)
                    except ContractError as err:
                        # The ledger's and embedder's runners own the DLQs; here we only skip.
                        log.warning("projection_skipped_message", topic=tp.topic, offset=m.offset, error=str(err))
            if upserts or deletes or shadows:
                await asyncio.to_thread(self._write, upserts, deletes, shadows)
                self.applied += len(upserts) + len(deletes)
            for cid, ev in self._drain_pending():
                self._command_done(cid, ev)
            if positions:
                self.ckpt.update(positions)
                await asyncio.to_thread(self._save_checkpoint)
            if not self.caught_up.is_set():
                pos = {tp: await c.position(tp) for tp in tps}
                if all(pos[tp] >= end[tp] for tp in tps):
                    self.caught_up.set()
                    log.info("qdrant_projection_caught_up", points=self.index.count(), parked=len(self.parked))

    def _drain_pending(self) -> list:
        out, self._pending_done = self._pending_done, []
        return out

    def _write(self, upserts: list, deletes: list, shadows: list) -> None:
        # Within a batch the last version of a record wins; deletes after upserts.
        latest: dict[str, tuple[MemoryRecord, list[float]]] = {}
        for r, vec in upserts:
            if self.versions.get(r.id, 0) == r.version:
                latest[r.id] = (r, vec)
        dead = [rid for rid in deletes if rid not in latest]
        self.index.upsert(list(latest.values()))
        self.index.delete(dead)
        for rid, flag in shadows:
            try:
                self.index.set_shadowed(rid, flag)
            except Exception:  # the live record is not a point (not ACTIVE): nothing to hide
                log.debug("shadow_target_missing", record_id=rid)

    def _save_checkpoint(self) -> None:
        self.index.flush()
        write_checkpoint(self.ckpt_path, self.ckpt)

    def status(self) -> dict[str, Any]:
        return {
            "points": self.index.count(),
            "parked": sum(len(b) for b in self.parked.values()),
            "caught_up": self.caught_up.is_set(),
            "applied": self.applied,
        }


def shard_path(settings: Settings, generation: int = 1) -> Path:
    return Path(settings.data_dir) / "qdrant" / f"memory-g{generation}"


__all__ = ["QdrantProjection", "Status", "shard_path"]
