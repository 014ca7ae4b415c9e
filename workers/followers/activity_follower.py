"""Follows memlane.turns, memlane.memory.events and memlane.usage into the activity view
(projections.redis.activity_view), inside each API process (services/http/following.py).

Why no consumer group: every API process reads every partition, group-less, like the other
in-process followers, and the view counts ids in sets, so two processes (or a replay, or a
redelivery) add the same ids and count each thing once. A group would split the reading but
not make it safe: a rebalance redelivers, so the writes would still have to be idempotent,
and a group's offsets would live apart from the view they describe. The cost is that each
process reads these topics; the turns topic the history projection reads already.

Where it starts: from the checkpoint in Redis (shared by the processes: any value there was
written after its counts, so resuming from it loses nothing; a lower one only re-reads), but
never earlier in the turns and events than the kept minutes need (`KEEP_MINUTES`): the
events topic is kept forever, and only the usage topic feeds the per-record recall counts,
which it reads from its beginning when there is no checkpoint.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog
from aiokafka import TopicPartition

from events.codec import Codec, ContractError
from events.rules.activity import KEEP_MINUTES, Recalled, Tick, counted, fresh, worth_decoding
from events.sealing import KeyDestroyed, KeyMissing
from events.topics import EVENTS, REDELIVERED, TURNS, USAGE
from projections.redis.activity_view import ActivityView
from settings import Settings
from workers.runtime.follower_poison import FollowerPoison
from workers.runtime.topic_reader import VIEW_CHECK_S, TopicReader, checkpoint_key, reached, tp_key

log = structlog.get_logger()
SOURCES = (TURNS, EVENTS, USAGE)
RETRY_S = 1.0
# A batch is decoded on the API's event loop: a few hundred messages keep each turn of it
# to tens of milliseconds while a restart catches up.
BATCH = 250


class ActivityFollower:
    def __init__(self, settings: Settings, view: ActivityView, keys: Any = None, *, codec: Codec) -> None:
        self.settings = settings
        self.codec = codec
        self.view = view
        self.keys = keys  # workers.runtime.data_keys.KeyTopic: catches up on keys not known yet; None with encryption off
        self.stopping = asyncio.Event()
        self.caught_up = asyncio.Event()
        self.counted = 0
        self.skipped = 0  # poison: messages that break the contract, parked in their DLQ
        self.poison = FollowerPoison(settings, "activity", codec)
        self.unreadable = 0  # sealed under a destroyed key (an erased subject)

    def _source(self, topic: str) -> str:
        return topic.removeprefix(self.settings.topic_prefix)

    async def _starts(self, reader: TopicReader, tps: list[TopicPartition]) -> dict[str, int]:
        """Where each partition starts: its checkpoint, moved forward in the turns and events
        to the first message of the kept minutes."""
        ckpt = await self.view.checkpoints()
        since_ms = int((time.time() - KEEP_MINUTES * 60) * 1000)
        recent = [tp for tp in tps if self._source(tp.topic) != USAGE.name]
        found = await reader.consumer.offsets_for_times({tp: since_ms for tp in recent})
        ends = await reader.consumer.end_offsets(recent)
        out = dict(ckpt)
        for tp in recent:
            at = found.get(tp)
            first = at.offset if at is not None else ends[tp]
            out[tp_key(tp)] = max(first, ckpt.get(tp_key(tp), 0))
        return out

    async def _decoded(self, source: str, m: Any) -> Any:
        if self.keys is None:
            return self.codec.decode(source, m.value)
        return await self.keys.opening(self.codec.decode, source, m.value)

    async def _count(self, source: str, m: Any) -> Any:
        """What a message counts; poison and unreadable messages count nothing and are tallied."""
        if not worth_decoding(source, m.value) or self.poison.for_another(m):
            return None
        try:
            message = await self._decoded(source, m)
        except (KeyDestroyed, KeyMissing):  # KeyMissing: a process without the keys topic to catch up on
            self.unreadable += 1
            return None
        except (ContractError, ValueError, TypeError, KeyError) as e:
            self.skipped += 1
            await self.poison.park(source, m, f"{type(e).__name__}: {e}")
            return None
        return counted(message, redelivered=(REDELIVERED, b"1") in (m.headers or ()))

    async def _apply(self, ticks: list[Tick], recalls: list[Recalled], positions: dict[str, int]) -> None:
        # Redis away for a while: the batch waits, the reader with it, nothing is lost.
        while True:
            try:
                await self.view.apply(ticks, recalls, positions)
                return
            except Exception as e:
                if self.stopping.is_set():
                    raise
                log.warning("activity_apply_failed", error=f"{type(e).__name__}: {e}")
                await asyncio.sleep(RETRY_S)

    async def run(self, until_caught_up: bool = False) -> None:
        try:
            await self._fold(until_caught_up)
        finally:
            await self.poison.aclose()

    async def _fold(self, until_caught_up: bool) -> None:
        s = self.settings
        tps = [TopicPartition(s.topic(t.name), p) for t in SOURCES for p in range(t.partitions)]
        async with TopicReader(s) as c:
            await c.assign(tps, await self._starts(c, tps))
            end = await c.ends(tps)
            applied, looked, empty = False, time.monotonic(), 0
            while not self.stopping.is_set():
                if applied and time.monotonic() - looked > VIEW_CHECK_S:
                    looked = time.monotonic()
                    empty = 0 if await self.view.checkpoints() else empty + 1
                    if empty >= 2:  # gone twice in a row, a second apart: Redis lost the view
                        log.warning("activity_view_lost_refolding")
                        await c.assign(tps, await self._starts(c, tps))
                        applied, empty = False, 0
                ticks: list[Tick] = []
                recalls: list[Recalled] = []
                positions: dict[str, int] = {}
                now_minute = int(time.time() // 60)
                for tp, msgs in (await c.poll(timeout_ms=500, max_records=BATCH)).items():
                    source = self._source(tp.topic)
                    for m in msgs:
                        got = await self._count(source, m)
                        if got is not None:
                            ticks += [t for t in got.ticks if fresh(t.minute, now_minute)]
                            if got.recalled is not None:
                                recalls.append(got.recalled)
                        positions[checkpoint_key(tp.topic, tp.partition)] = m.offset + 1
                if positions:
                    await self._apply(ticks, recalls, positions)
                    self.counted += len(ticks)
                    applied = True
                if not self.caught_up.is_set() and reached(await c.positions(tps), end):
                    self.caught_up.set()
                    log.info("activity_caught_up", counted=self.counted, skipped=self.skipped)
                    if until_caught_up:
                        break

    def status(self) -> dict[str, Any]:
        return {"caught_up": self.caught_up.is_set(), "counted": self.counted, "skipped": self.skipped,
                "parked": self.poison.parked, "unreadable": self.unreadable}
