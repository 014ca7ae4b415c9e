"""Folds committed turns into the history Edge shard, inside the API process.

An Edge shard belongs to one process, so the process that serves history search owns
the shard and follows `memlane.turns` itself, over every partition, without a
consumer group. The checkpoint is a file next to the shard, written after the shard
is flushed: after a crash the projection re-reads at most what it had not flushed, and
re-folding a turn upserts the same point ids. Deleting the shard and its checkpoint
rebuilds it from the topic.

Parts are embedded here, in a worker thread, batched per fetch: history takes the
short path (no ledger, no `memlane.vectors`; why: docs/history-path.md).

A part's text is sealed on the event loop (where a key made for it is published before the
shard is written), then embedded and written in the thread. The projection follows
`memlane.memory.events` too, for `SubjectErased`: the subject's parts go, and the erasure is
remembered in the checkpoint file (`_erased`), so a turn folded after it, from before it,
is not kept again.
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
from events.memory import SubjectErased
from events.rules.history import erased, erasure_marker, kept_events
from events.topics import EVENTS, TURNS
from events.turns import TurnCommitted
from projections.history_index import HistoryIndex, event_parts, pack
from projections.qdrant_index import read_checkpoint, write_checkpoint
from projections.records import Erasure
from settings import Settings
from workers.history import erasure_at, erasure_of
from workers.topic_reader import TopicReader, reached, read_so_far, tp_key

log = structlog.get_logger()
FLUSH_EVERY_S = 5.0
ERASED = "_erased"  # the checkpoint file's entry of erasure markers (events.rules.history)


def history_shard_path(settings: Settings, generation: int = 1) -> Path:
    return Path(settings.data_dir) / "qdrant" / f"history-g{generation}"


class HistoryQdrantProjection:
    def __init__(self, settings: Settings, index: HistoryIndex, embedder: Any, keys: Any = None) -> None:
        self.settings = settings
        self.index = index
        self.embedder = embedder
        self.keys = keys  # workers.keys.KeyTopic: publishes the keys parts are sealed under first
        self.ckpt_path = index.path.parent / f"{index.path.name}.checkpoint.json"
        self.ckpt: dict[str, int] = read_checkpoint(self.ckpt_path)
        self.erased: dict[str, int] = self.ckpt.pop(ERASED, {})  # type: ignore[arg-type]
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

    def _remember(self, erasures: list[tuple[Erasure, int]]) -> None:
        for er, at in erasures:
            marker = erasure_marker(er.tenant, er.agent, er.user)
            self.erased[marker] = max(at, self.erased.get(marker, -1))

    def _parts(self, turns: list[TurnCommitted]) -> list[tuple[str, dict[str, Any], str]]:
        """(point id, sealed payload, text) of each part of the turns' kept events that no
        erasure reaches. On the event loop: a key it makes is published before the write."""
        return [(pid, pack(payload), payload["text"]) for t in turns for e in kept_events(t)
                if not erased(self.erased, e) for pid, payload in event_parts(e)]

    def _write(self, rows: list[tuple[str, dict[str, Any], str]], erasures: list[tuple[Erasure, int]]) -> int:
        for er, _ in erasures:
            self.index.purge(er)
        vecs = self._embed([text for _, _, text in rows]) if rows else []
        self.index.upsert_packed([(pid, p, text, v) for (pid, p, text), v in zip(rows, vecs, strict=True)])
        return len({(p["session"], p["event_id"]) for _, p, _ in rows})

    def _save_checkpoint(self) -> None:
        self.index.flush()
        write_checkpoint(self.ckpt_path, {**self.ckpt, ERASED: self.erased})

    async def run(self, until_caught_up: bool = False, progress: Callable[[int, int], None] | None = None) -> None:
        s = self.settings
        tps = [TopicPartition(s.topic(TURNS.name), p) for p in range(TURNS.partitions)]
        events_topic = s.topic(EVENTS.name)
        tps += [TopicPartition(events_topic, p) for p in range(EVENTS.partitions)]
        async with TopicReader(s) as c:
            await c.assign(tps, self.ckpt)
            end = await c.ends(tps)
            total = sum(end.values())
            dirty, last_flush = False, time.monotonic()
            while not self.stopping.is_set():
                turns: list[TurnCommitted] = []
                erasures: list[tuple[Erasure, int]] = []
                positions: dict[str, int] = {}
                for tp, msgs in (await c.poll(timeout_ms=200, max_records=1000)).items():
                    part = tp_key(tp)
                    for m in msgs:
                        try:
                            if tp.topic == events_topic:
                                ev = erasure_of(EVENTS.name, m.value) if m.value else None
                            else:
                                ev = decode(TURNS.name, m.value)
                        except ContractError as err:
                            # The history worker parks poison in the DLQ; a reader only skips it.
                            log.warning("history_skipped_message", topic=tp.topic, offset=m.offset, error=str(err))
                            ev = None
                        if isinstance(ev, TurnCommitted):
                            turns.append(ev)
                        elif isinstance(ev, SubjectErased):
                            erasures.append(erasure_at(ev))
                        positions[part] = m.offset + 1
                if positions:
                    # The batch's erasures are remembered before its turns are sealed: a turn
                    # from before one is not kept, whichever topic came first.
                    self._remember(erasures)
                    rows = self._parts(turns)
                    if rows and self.keys is not None:
                        await self.keys.flush()
                    kept = await asyncio.to_thread(self._write, rows, erasures)
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
