"""Memory as it stood at a moment: an agent's events folded from the log up to a point.

The point is a time (the log's own: when the ledger wrote each event) or a position (an offset of
the agent's event partition: the events before it). The fold is the reference fold the projections
agree with (`projections.records.MemoryFold`), so a listing, a read or a record's versions as of
a point are those a projection rebuilt from the log cut there would give.

What is gone now stays gone as of any point: an event sealed under a destroyed key (an erased
member or agent) does not open and is left out, and the agent's erasures and purges written after
the point are applied too. Cost: a read of the agent's event partition from its start up to now
on the first call, then of what it gained; a fold per point asked, the last few kept
(docs/features/time-travel.md).
"""

from __future__ import annotations

import asyncio
import bisect
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiokafka import TopicPartition

from events.base import utcnow
from events.codec import Codec, ContractError
from events.commands import WORKSPACE
from events.memory import RecordsPurged, SubjectErased
from events.topics import EVENTS
from projections.records import ERASED_MARK, MemoryFold, opening
from settings import Settings
from workers.runtime.topic_reader import TopicReader

GONE = (SubjectErased, RecordsPurged)


@dataclass(frozen=True)
class Point:
    """A moment of an agent's log: a time, or a position in its event partition."""

    at: datetime | None = None
    position: int | None = None
    partition: int | None = None  # the partition a `partition:offset` position names, checked

    @classmethod
    def parse(cls, text: str) -> Point:
        """`as_of`: an ISO 8601 time with its offset, or a log position: an offset, or
        `partition:offset` as `X-Memlane-Position` reports them. Raises ValueError naming the forms
        it takes."""
        if text.isdigit():
            return cls(position=int(text))
        partition, colon, offset = text.partition(":")
        if colon and partition.isdigit() and offset.isdigit():
            return cls(position=int(offset), partition=int(partition))
        try:
            at = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError("as_of: a time such as 2026-03-01T12:00:00Z, or a log position (a whole number, "
                             "the offset of the agent's event partition a read gave in X-Memlane-Position)") from None
        if at.tzinfo is None:
            raise ValueError("as_of: give the time's offset from UTC (for example Z or +02:00)")
        return cls(at=at)


@dataclass(frozen=True)
class Logged:
    offset: int
    at_ms: int  # the log's time: when the ledger wrote it
    event: Any


@dataclass
class AgentLog:
    """An agent's events read so far, and the tenant's erasures filed under its workspace agent;
    `next`: where each of the two partitions' reading goes on."""

    logged: list[Logged] = field(default_factory=list)
    erasures: list[Any] = field(default_factory=list)
    next: dict[int, int] = field(default_factory=dict)
    generation: int = 0  # counts re-reads from the start: a fold cached under an older one is stale


@dataclass(frozen=True)
class Past:
    """Memory at a point: its fold, the moment it stood for, and `key`, which names this fold
    (agent, cut and the log's generation) for caches built on it."""

    fold: MemoryFold
    at: datetime
    key: tuple[str, str, int, int]


# How far this process's live reads serve an agent's event partition: the offset before which
# they hold all of it.
Served = Callable[[str, str], int]

# Decoded events kept across calls (every agent's together), and folds kept: a fold of 100,000
# records is some 200 MB, so only the last few points asked are kept.
CACHED_EVENTS = 400_000
CACHED_FOLDS = 2


class PastMemory:
    """Reads the agent's events from the log and folds those before a point.

    The events read are kept, so a later call reads only what the log gained since; a gain
    holding an erasure or a purge drops what was kept and reads the agent again from the start,
    so no event is served from memory that no longer opens (its key destroyed)."""

    def __init__(self, settings: Settings, codec: Codec, keys: Any = None) -> None:
        self.settings = settings
        self.codec = codec
        self.keys = keys  # workers.runtime.data_keys.KeyTopic: catches up on a key not known yet
        self.logs: OrderedDict[tuple[str, str], AgentLog] = OrderedDict()
        self.folds: OrderedDict[tuple[str, str, int, int], MemoryFold] = OrderedDict()
        self._lock = asyncio.Lock()
        self._reader: TopicReader | None = None

    async def fold(self, tenant: str, agent: str, point: Point) -> MemoryFold:
        """Raises ValueError for a position of another partition than the agent's."""
        return (await self.past(tenant, agent, point)).fold

    async def past(self, tenant: str, agent: str, point: Point, served: Served | None = None) -> Past:
        """Raises ValueError for a position of another partition than the agent's. `served`: how far
        this process's live reads serve a partition; when the events kept reach as far, the log
        is not asked again (a past read is then as fresh as a read of now)."""
        partition = EVENTS.partition_of(f"{tenant}/{agent}".encode())
        if point.partition is not None and point.partition != partition:
            raise ValueError(f"as_of: position {point.partition}:{point.position} is of event partition "
                             f"{point.partition}; this agent's events are in partition {partition}")
        async with self._lock:
            log = self.logs.get((tenant, agent))
            if log is None or not kept_enough(log, tenant, agent, point, served):
                log = await self._caught_up(tenant, agent)
            self.logs.move_to_end((tenant, agent))
            logged = log.logged
            end = logged[-1].offset + 1 if logged else 0
            cut = end if point.position is None else point.position
            if point.at is not None:
                at_ms = int(point.at.timestamp() * 1000)
                cut = next((x.offset for x in logged if x.at_ms >= at_ms), end)
            key = (tenant, agent, log.generation, cut)
            at = point.at or moment_of(logged, cut)
            if (fold := self.folds.get(key)) is None:
                before = [x.event for x in logged if x.offset < cut]
                after = [x.event for x in logged if x.offset >= cut and isinstance(x.event, GONE)]
                fold = MemoryFold()
                await fold.apply(before + after + log.erasures)
                self.folds[key] = fold
                while len(self.folds) > CACHED_FOLDS:
                    self.folds.popitem(last=False)
            self.folds.move_to_end(key)
            return Past(fold, at, key)

    async def events(self, tenant: str, agent: str) -> list[Logged]:
        """The agent's events as the log holds them now, each with its offset and log time; those
        that no longer open (their keys destroyed) are left out."""
        log = AgentLog()
        await self._read(tenant, agent, log, erasures=False)
        return log.logged

    async def _caught_up(self, tenant: str, agent: str) -> AgentLog:
        """The agent's log, read up to the end as of now."""
        log = self.logs.pop((tenant, agent), None) or AgentLog()
        if await self._read(tenant, agent, log):
            # An erasure or a purge came: what was kept may hold events that no longer open.
            log = AgentLog(generation=log.generation + 1)
            await self._read(tenant, agent, log)
        self.logs[(tenant, agent)] = log
        while sum(len(x.logged) for x in self.logs.values()) > CACHED_EVENTS and len(self.logs) > 1:
            self.logs.popitem(last=False)
        return log

    async def _read(self, tenant: str, agent: str, log: AgentLog, erasures: bool = True) -> bool:
        """Reads on into `log` the agent's events, and the tenant's erasures of its members on
        every agent and of the tenant itself, whenever written: those are filed under its
        workspace agent, in that agent's partition. One reader for both: starting a consumer
        costs more than reading a partition. Whether what it read held an erasure or a purge
        and `log` held events before."""
        key, erasing = f"{tenant}/{agent}".encode(), f"{tenant}/{WORKSPACE}".encode()
        topic = self.settings.topic(EVENTS.name)
        tps = {TopicPartition(topic, EVENTS.partition_of(key))}
        if erasures and agent != WORKSPACE:
            tps.add(TopicPartition(topic, EVENTS.partition_of(erasing)))
        had = bool(log.logged or log.erasures)
        msgs = await self._gained(sorted(tps), log.next) if erasures else await self._all(sorted(tps))
        gone = False
        for m in sorted(msgs, key=lambda m: (m.partition, m.offset)):
            if m.key == key and (e := await self._opened(m.value)) is not None:
                log.logged.append(Logged(m.offset, m.timestamp, e))
                gone = gone or isinstance(e, GONE)
            elif (erasures and m.key == erasing and ERASED_MARK in (m.value or b"")
                  and isinstance(e := await self._opened(m.value), SubjectErased)):
                log.erasures.append(e)
                gone = True
        return had and gone

    async def _gained(self, tps: list[TopicPartition], next_at: dict[int, int]) -> list[Any]:
        """What `tps` hold from `next_at` to their ends as of now, moving `next_at` there. One
        reader kept started: asking where the partitions end costs a round trip, starting a
        consumer many."""
        if self._reader is None:
            self._reader = TopicReader(self.settings)
            await self._reader.start()
        reader = self._reader
        end = await reader.ends(tps)
        behind = [tp for tp in tps if end[tp] > next_at.get(tp.partition, 0)]
        if not behind:
            return []
        # Kept assigned where the last call left off, the reader has fetched what came since
        # already; assigning or seeking again would drop that and wait for a new fetch.
        if reader.consumer.assignment() != set(tps) or [
                tp for tp in tps if await reader.position(tp) != next_at.get(tp.partition, 0)]:
            await reader.assign(tps, start=next_at)
        out: list[Any] = []
        while [tp for tp in behind if await reader.position(tp) < end[tp]]:
            for msgs in (await reader.poll(*behind, timeout_ms=500, max_records=5000)).values():
                out += msgs
        for tp in behind:
            next_at[tp.partition] = await reader.position(tp)
        return out

    async def _all(self, tps: list[TopicPartition]) -> list[Any]:
        async with TopicReader(self.settings) as reader:
            return await reader.read_all(tps)

    async def __aenter__(self) -> PastMemory:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._reader is not None:
            await self._reader.stop()
            self._reader = None

    async def _opened(self, value: bytes | None) -> Any:
        """The event, or None for one that no longer opens (its key destroyed) or is not one."""
        if not value:
            return None
        try:
            return await opening(self.keys, self.codec.decode, EVENTS.name, value)
        except ContractError:
            return None


def kept_enough(log: AgentLog, tenant: str, agent: str, point: Point, served: Served | None) -> bool:
    """Whether `log` holds the point's position and every event of the agent's and its workspace's
    partitions that `served` says this process's live reads serve."""
    if served is None:
        return False
    mine, workspace = (EVENTS.partition_of(f"{tenant}/{a}".encode()) for a in (agent, WORKSPACE))
    if point.position is not None and point.position > log.next.get(mine, 0):
        return False
    return log.next.get(mine, 0) >= served(tenant, agent) and (
        agent == WORKSPACE or log.next.get(workspace, 0) >= served(tenant, WORKSPACE))


def moment_of(logged: list[Logged], cut: int) -> datetime:
    """The moment a position stands for: when the event at it was written (just before it), or
    now for the log's end."""
    at = bisect.bisect_left(logged, cut, key=lambda x: x.offset)
    return utcnow() if at == len(logged) else datetime.fromtimestamp((logged[at].at_ms - 1) / 1000, tz=UTC)
