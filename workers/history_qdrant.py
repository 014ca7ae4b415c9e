"""Folds committed turns into the history Edge shard, inside the API process.

An Edge shard belongs to one process, so the process that serves history search owns
the shard and follows `memlane.turns` itself, over every partition, without a
consumer group. The checkpoint is a file next to the shard, written after the shard
is flushed: after a crash the projection re-reads at most what it had not flushed, and
re-folding a turn upserts the same point ids. Deleting the shard and its checkpoint
rebuilds it from the topic.

Parts are embedded here, in a worker thread, batched per fetch: history takes the
short path (no ledger, no `memlane.vectors`; why: docs/history-path.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
from aiokafka import TopicPartition

from events.codec import ContractError, decode
from events.rules.history import kept_events
from events.topics import TURNS
from events.turns import TurnCommitted
from projections.history_index import HistoryIndex, event_parts
from projections.qdrant_index import read_checkpoint, write_checkpoint
from settings import Settings
from workers.topic_reader import TopicReader, reached, read_so_far, tp_key

log = structlog.get_logger()
FLUSH_EVERY_S = 5.0


def history_shard_path(settings: Settings, generation: int = 1) -> Path:
    return Path(settings.data_dir) / "qdrant" / f"history-g{generation}"


class HistoryQdrantProjection:
    def __init__(self, settings: Settings, index: HistoryIndex, embedder: Any) -> None:
        self.settings = settings
        self.index = index
        self.embedder = embedder
        self.ckpt_path = index.path.parent / f"{index.path.name}.checkpoint.json"
        self.ckpt: dict[str, int] = read_checkpoint(self.ckpt_path)
        self.turns = 0
        self.events = 0
        self.stopping = asyncio.Event()
        self.caught_up = asyncio.Event()

    def _embed(self, texts: list[str]) -> list[list[float]]:
        # One call per fold, each distinct text once, so the embedder batches texts of one
        # token count (figures: docs/embedder-batching.md). Texts repeated across folds
        # (greetings, tool boilerplate) are the API embedder's cache's to keep.
        unique = list(dict.fromkeys(texts))
        by_text = dict(zip(unique, self.embedder.embed(unique), strict=True))
        return [by_text[t] for t in texts]

    def _write(self, turns: list[TurnCommitted]) -> int:
        rows = [(pid, payload) for t in turns for e in kept_events(t) for pid, payload in event_parts(e)]
        vecs = self._embed([p["text"] for _, p in rows]) if rows else []
        self.index.upsert([(pid, p, v) for (pid, p), v in zip(rows, vecs, strict=True)])
        return len({(p["session"], p["event_id"]) for _, p in rows})

    def _save_checkpoint(self) -> None:
        self.index.flush()
        write_checkpoint(self.ckpt_path, self.ckpt)

    async def run(self, until_caught_up: bool = False, progress: Callable[[int, int], None] | None = None) -> None:
        s = self.settings
        tps = [TopicPartition(s.topic(TURNS.name), p) for p in range(TURNS.partitions)]
        async with TopicReader(s) as c:
            await c.assign(tps, self.ckpt)
            end = await c.ends(tps)
            total = sum(end.values())
            dirty, last_flush = False, time.monotonic()
            while not self.stopping.is_set():
                turns: list[TurnCommitted] = []
                positions: dict[str, int] = {}
                for tp, msgs in (await c.poll(timeout_ms=200, max_records=1000)).items():
                    part = tp_key(tp)
                    for m in msgs:
                        try:
                            ev = decode(TURNS.name, m.value)
                        except ContractError as err:
                            # The history worker parks poison in the DLQ; a reader only skips it.
                            log.warning("history_skipped_message", topic=tp.topic, offset=m.offset, error=str(err))
                            ev = None
                        if isinstance(ev, TurnCommitted):
                            turns.append(ev)
                        positions[part] = m.offset + 1
                if positions:
                    kept = await asyncio.to_thread(self._write, turns)
                    self.ckpt.update(positions)
                    self.turns += len(turns)
                    self.events += kept
                    dirty = True
                pos = await c.positions(tps)
                done = reached(pos, end)
                # Flushing is what makes a checkpoint safe, and it is costly (it grows with the
                # shard; figures: docs/qdrant-edge.md), so it runs every few seconds,
                # not on each pause of the stream; a crash replays those seconds' turns, which
                # upsert the same point ids.
                if dirty and time.monotonic() - last_flush > FLUSH_EVERY_S:
                    await asyncio.to_thread(self._save_checkpoint)
                    dirty, last_flush = False, time.monotonic()
                if progress:
                    progress(read_so_far(pos, end), total)
                if done and not self.caught_up.is_set():
                    self.caught_up.set()
                    log.info("history_projection_caught_up", points=self.index.count(), turns=self.turns)
                    if until_caught_up:
                        break
            if dirty:
                await asyncio.to_thread(self._save_checkpoint)

    def status(self) -> dict[str, Any]:
        return {
            "points": self.index.count(),
            "turns": self.turns,
            "events": self.events,
            "caught_up": self.caught_up.is_set(),
        }
