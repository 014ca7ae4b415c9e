"""Memory as it stood at a moment: an agent's events folded from the log up to a point.

The point is a time (the log's own: when the ledger wrote each event) or a position (an offset of
the agent's event partition: the events before it). The fold is the reference fold the projections
agree with (`projections.records.MemoryFold`), so a listing, a read or a record's versions as of
a point are those a projection rebuilt from the log cut there would give.

What is gone now stays gone as of any point: an event sealed under a destroyed key (an erased
member or agent) does not open and is left out, and the agent's erasures and purges written after
the point are applied too. Cost: a read of the agent's event partition from its start up to now,
once per call (docs/features/time-travel.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from aiokafka import TopicPartition

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


class PastMemory:
    """Reads the agent's events from the log and folds those before a point."""

    def __init__(self, settings: Settings, codec: Codec, keys: Any = None) -> None:
        self.settings = settings
        self.codec = codec
        self.keys = keys  # workers.runtime.data_keys.KeyTopic: catches up on a key not known yet

    async def fold(self, tenant: str, agent: str, point: Point) -> MemoryFold:
        """Raises ValueError for a position of another partition than the agent's."""
        key = f"{tenant}/{agent}".encode()
        partition = EVENTS.partition_of(key)
        if point.partition is not None and point.partition != partition:
            raise ValueError(f"as_of: position {point.partition}:{point.position} is of event partition "
                             f"{point.partition}; this agent's events are in partition {partition}")
        logged, erasures = await self._read(tenant, agent)
        end = logged[-1].offset + 1 if logged else 0
        cut = end if point.position is None else point.position
        if point.at is not None:
            at_ms = int(point.at.timestamp() * 1000)
            cut = next((x.offset for x in logged if x.at_ms >= at_ms), end)
        before = [x.event for x in logged if x.offset < cut]
        after = [x.event for x in logged if x.offset >= cut and isinstance(x.event, GONE)]
        fold = MemoryFold()
        await fold.apply(before + after + erasures)
        return fold

    async def events(self, tenant: str, agent: str) -> list[Logged]:
        """The agent's events as the log holds them now, each with its offset and log time; those
        that no longer open (their keys destroyed) are left out."""
        return (await self._read(tenant, agent, erasures=False))[0]

    async def _read(self, tenant: str, agent: str, erasures: bool = True) -> tuple[list[Logged], list[Any]]:
        """The agent's events, and the tenant's erasures of its members on every agent and of the
        tenant itself, whenever written: those are filed under its workspace agent, in that agent's
        partition. One reader for both: starting a consumer costs more than reading a partition."""
        key, erasing = f"{tenant}/{agent}".encode(), f"{tenant}/{WORKSPACE}".encode()
        topic = self.settings.topic(EVENTS.name)
        tps = {TopicPartition(topic, EVENTS.partition_of(key))}
        if erasures and agent != WORKSPACE:
            tps.add(TopicPartition(topic, EVENTS.partition_of(erasing)))
        async with TopicReader(self.settings) as reader:
            msgs = await reader.read_all(sorted(tps))
        logged, erased = [], []
        for m in sorted(msgs, key=lambda m: (m.partition, m.offset)):
            if m.key == key and (e := await self._opened(m.value)) is not None:
                logged.append(Logged(m.offset, m.timestamp, e))
            elif (erasures and m.key == erasing and ERASED_MARK in (m.value or b"")
                  and isinstance(e := await self._opened(m.value), SubjectErased)):
                erased.append(e)
        return logged, erased

    async def _opened(self, value: bytes | None) -> Any:
        """The event, or None for one that no longer opens (its key destroyed) or is not one."""
        if not value:
            return None
        try:
            return await opening(self.keys, self.codec.decode, EVENTS.name, value)
        except ContractError:
            return None
