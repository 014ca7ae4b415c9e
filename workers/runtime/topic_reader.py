"""One way to read topics from checkpoints, for every process that owns its partitions.

A checkpoint maps `checkpoint_key(topic, partition)` to the next offset to read; it lives
with the view it describes (a Redis hash, a file next to an Edge shard), so a projection
resumes where its view is, not where a consumer group was. `TopicReader` is the group-less
reader the Qdrant projections and the rebuild use; a worker in a consumer group seeks its
assigned partitions with `seek_to_checkpoints`. Everything here works per batch: a
projection's per-message loop stays its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from workers.runtime.kafka_io import reader

Checkpoints = Mapping[str, int]


def checkpoint_key(topic: str, partition: int) -> str:
    """The field a checkpoint keeps a partition's next offset under. It names the real
    (prefixed) topic: several deployments may share one Redis."""
    return f"{topic}:{partition}"


def key_partition(key: str) -> int:
    return int(key.rsplit(":", 1)[1])


def of_topic(ckpt: Checkpoints, topic: str) -> dict[int, int]:
    """A checkpoint's positions in `topic`, by partition."""
    out: dict[int, int] = {}
    for k, v in ckpt.items():
        t, _, p = k.rpartition(":")
        if t == topic:
            out[int(p)] = v
    return out


def tp_key(tp: TopicPartition) -> str:
    return checkpoint_key(tp.topic, tp.partition)


async def seek_to_checkpoints(c: AIOKafkaConsumer, tps: Iterable[TopicPartition], ckpt: Checkpoints) -> None:
    """Move each of `tps` (already assigned) to its checkpoint, or to the beginning without one."""
    for tp in tps:
        nxt = ckpt.get(tp_key(tp))
        if nxt is None:
            await c.seek_to_beginning(tp)
        else:
            c.seek(tp, nxt)


# How often a projection whose checkpoint lives in Redis with its view looks for it: a view
# that has applied something and then holds no checkpoint lost its data (Redis was wiped, or
# restored from an empty copy), and its projection reads the log again from the start.
VIEW_CHECK_S = 1.0


class TopicReader:
    """A group-less consumer over partitions the caller owns, resuming at checkpoints.

    A replay's range ends at a stop offset (see `ends`): `poll` drops what lies at or past
    it and pauses that partition."""

    def __init__(self, settings: Any, max_poll_records: int = 1000) -> None:
        self.consumer = reader(settings, max_poll_records=max_poll_records)
        self.stop_at: dict[TopicPartition, int] = {}

    async def __aenter__(self) -> TopicReader:
        await self.consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.consumer.stop()

    async def start(self) -> None:
        await self.consumer.start()

    async def stop(self) -> None:
        await self.consumer.stop()

    async def assign(
        self, tps: list[TopicPartition], checkpoints: Checkpoints | None = None, start: Mapping[int, int] | None = None
    ) -> None:
        """Read `tps`, each from its checkpoint, else from `start[partition]`, else from the beginning."""
        self.consumer.assign(tps)
        self.stop_at = {}
        ckpt = checkpoints or {}
        if start:
            ckpt = {**{checkpoint_key(tp.topic, tp.partition): start[tp.partition] for tp in tps
                       if tp.partition in start}, **ckpt}
        await seek_to_checkpoints(self.consumer, tps, ckpt)

    async def ends(
        self, tps: list[TopicPartition], stop: Mapping[TopicPartition, int] | None = None
    ) -> dict[TopicPartition, int]:
        """Where each of `tps` ends now (its last stable offset). A partition in `stop` ends
        at the lower of that and its stop offset, and `poll` reads nothing of it from there."""
        end = await self.consumer.end_offsets(tps)
        for tp, limit in (stop or {}).items():
            end[tp] = self.stop_at[tp] = min(end[tp], limit)
        return end

    async def poll(self, *tps: TopicPartition, timeout_ms: int, max_records: int) -> dict[TopicPartition, list]:
        """A batch of messages per partition (of `tps`, or all assigned), none past a stop."""
        batches = await self.consumer.getmany(*tps, timeout_ms=timeout_ms, max_records=max_records)
        if self.stop_at:
            for tp, msgs in batches.items():
                limit = self.stop_at.get(tp)
                if limit is not None and msgs and msgs[-1].offset >= limit:
                    batches[tp] = [m for m in msgs if m.offset < limit]
                    self.consumer.pause(tp)  # a replay's range ends here
        return batches

    async def read_all(self, tps: list[TopicPartition]) -> list:
        """Every message of `tps`, from the beginning up to where each ends as of now."""
        await self.assign(tps)
        end = await self.ends(tps)
        out: list = []
        while [tp for tp in tps if await self.position(tp) < end[tp]]:
            for msgs in (await self.poll(*tps, timeout_ms=500, max_records=5000)).values():
                out += msgs
        return out

    async def position(self, tp: TopicPartition) -> int:
        return await self.consumer.position(tp)

    async def positions(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: await self.consumer.position(tp) for tp in tps}

    async def read_to_end(self, tps: list[TopicPartition]) -> bool:
        """Whether every one of `tps` has been read up to its end as of now."""
        if not tps:
            return True
        end = await self.consumer.end_offsets(tps)
        for tp in tps:
            if await self.consumer.position(tp) < end[tp]:
                return False
        return True

    def last_stable_offset(self, tp: TopicPartition) -> int | None:
        return self.consumer.last_stable_offset(tp)

    def pause(self, *tps: TopicPartition) -> None:
        self.consumer.pause(*tps)

    def resume(self, *tps: TopicPartition) -> None:
        self.consumer.resume(*tps)


def reached(pos: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int]) -> bool:
    return all(pos[tp] >= end[tp] for tp in end)


def read_so_far(pos: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int]) -> int:
    """Messages read so far towards `end` (what a progress display shows against sum(end))."""
    return sum(min(pos[tp], end[tp]) for tp in end)
