"""What a worker's processor is to the runner (`workers.runtime.runner`): the `Processor` base
class, the `Out` and `DeadLetter` it returns, and the exceptions that tell the runner to try a
message again (`Transient`) or to leave it for the partition's next owner (`Stopping`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition

from events.codec import Codec
from settings import Settings
from workers.runtime.data_keys import KeyTopic


class Transient(Exception):
    """Raised by a processor when a dependency is down and the message must wait."""


class Stopping(Exception):
    """Raised by a processor that gave up on a message because the worker is stopping:
    the batch stays uncommitted, for the partition's next owner."""


async def until_folded(checkpoints: Callable[[], Any], field: str, offset: int, stopping: asyncio.Event,
                       timeout_s: float, worker: str, inclusive: bool = False) -> None:
    """Until another worker's view (its `checkpoints()`, next offset by partition field) has
    folded `field` up to `offset` (through it, when `inclusive`). `Stopping` when the worker
    stops meanwhile; `Transient`, so the message is tried again, after `timeout_s`."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (await checkpoints()).get(field, -1) < offset + inclusive:
        if stopping.is_set():
            raise Stopping(f"stopping while the {worker} worker catches up")
        if asyncio.get_running_loop().time() > deadline:
            raise Transient(f"the {worker} worker has not folded {field} up to offset {offset}; is it running?")
        await asyncio.sleep(0.1)


@dataclass(frozen=True)
class Out:
    topic: str  # registry name, without the settings prefix
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()
    partition: int | None = None  # None: the key's


@dataclass(frozen=True)
class DeadLetter:
    """Returned among a processor's outputs: park the input message in `<topic>.dlq`.

    Unlike raising, the processor's other outputs still go out, in the same transaction:
    it can give up on part of its work (a model that keeps failing) and still finish the
    rest (forwarding the turn's outcome).
    """

    error: str
    attempt: int = 1


class Processor:
    """Base class: subclasses name their sources and implement `process`."""

    name = "processor"
    sources: tuple[str, ...] = ()
    transactional = False
    # Messages of different keys may be processed concurrently (in key order within a
    # key), across all the partitions one poll returned; their outputs and offsets then
    # commit together. For processors that wait on I/O per message, such as model calls.
    # A key's next message may start early when the processor calls `release_key()`.
    concurrent_keys = False
    # Seconds between calls of `tick`, polls with messages or not; None: never.
    tick_every: float | None = None
    # The process's keys (`workers.runtime.data_keys`), set by the runner before `start`; None with encryption off.
    keys: KeyTopic | None = None
    # /ready waits until the worker has read, after each assignment, up to where its partitions
    # ended then (a projection's view has caught up); see `Runner.not_ready`.
    catch_up_on_start = False
    # Milliseconds the broker may hold a fetch for more input (`workers.runtime.kafka_io.consumer`):
    # for processors whose output is a count no one waits for, so a batch, and the
    # transaction it costs downstream, covers that much time rather than one message.
    gather_ms = 0

    def __init__(self, settings: Settings, *, codec: Codec) -> None:
        self.settings = settings
        # Seals what it writes and opens what it reads; its keyring is the process's, which the
        # runner loads and follows (`keys`) before `start`.
        self.codec = codec
        # Set on SIGTERM/SIGINT (shared with the runner): long work such as a recovery
        # checks it and gives up, and what it had not committed goes to the next owner.
        self.stopping = asyncio.Event()

    def decode(self, source: str, data: bytes) -> Any:
        """The message as `process` takes it; raises `ContractError` for the DLQ."""
        return self.codec.decode(source, data)

    def decode_message(self, source: str, message: Any) -> Any:
        """`decode` of a consumed message, for processors that read its headers too."""
        return self.decode(source, message.value)

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def assigned(self, consumer: Any, partitions: set[TopicPartition]) -> None: ...

    async def revoked(self, partitions: set[TopicPartition]) -> None: ...

    async def process(self, source: str, partition: int, offset: int, value: Any) -> Sequence[Out | DeadLetter]:
        raise NotImplementedError

    async def batch_done(self) -> list[Out]:
        """Called after a partition batch (for `concurrent_keys` processors: a poll's
        batches) is processed and before its offsets commit.

        Returns more outputs to send with the batch (for processors that work in batches).
        """
        return []

    def committed(self, written: list[Any]) -> None:
        """Called once a batch's outputs are committed, with the `RecordMetadata` (topic,
        partition, offset) of each, in the order they were sent."""

    async def tick(self) -> list[Out]:
        """Called every `tick_every` seconds between polls, even when no message comes: for
        work that time alone makes due. Its outputs commit like a batch's, with no offsets."""
        return []

    def not_ready(self, partitions: set[int]) -> list[str]:
        """Why the worker cannot serve its assigned `partitions` yet (for /ready); empty: it can."""
        return []

    async def sample(self, ends: dict[TopicPartition, int]) -> None:
        """Sets the processor's own gauges (docs/reference/metrics.md), every few seconds; `ends`: its
        assigned partitions' end offsets."""
