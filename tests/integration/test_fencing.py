"""Stable transactional ids against the real broker: a worker's successor with its id aborts the
transaction it left open at once, and a live worker fenced by a producer with its id drops what
it had not committed, rejoins its group and finishes the work, each input once.

Every output goes to one partition, which a `read_committed` read only sees up to its first open
transaction: an orphan there would hide everything after it until the broker timed it out.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

from events.codec import PLAIN
from events.topics import COMMANDS, EVENTS
from settings import Settings
from tests.conftest import eventually
from tests.e2e.extraction_support import read_topic
from workers.runtime.kafka_io import ensure_topics, producer
from workers.runtime.runner import Out, Processor, Runner

N = 30
# The orphan's own timeout: far longer than the tests wait, so only a fence can end it in time.
ORPHAN_TIMEOUT_MS = 300_000


class Copy(Processor):
    """Copies each command to the events topic's partition 0; holds at `hold_at` until `go`."""

    name = "fence-copy"
    sources = (COMMANDS.name,)
    transactional = True

    def __init__(self, settings: Settings, hold_at: bytes | None = None) -> None:
        super().__init__(settings, codec=PLAIN)
        self.hold_at = hold_at
        self.held, self.go = asyncio.Event(), asyncio.Event()

    def decode(self, source, data):
        return data

    async def process(self, source, partition, offset, value):
        if value == self.hold_at and not self.go.is_set():
            self.held.set()
            await self.go.wait()
        return [Out(EVENTS.name, b"k", value, partition=0)]


def isolated(settings: Settings, instance: str) -> Settings:
    return Settings(topic_prefix=f"{settings.topic_prefix}fx{uuid.uuid4().hex[:6]}.", data_dir=settings.data_dir,
                    worker_instance=instance)


async def publish(s: Settings, values: list[bytes]) -> None:
    p = producer(s)
    await p.start()
    try:
        for i, v in enumerate(values):  # keys spread them over the partitions
            await p.send_and_wait(s.topic(COMMANDS.name), v, key=f"k{i}".encode())
    finally:
        await p.stop()


async def outputs(s: Settings) -> Counter:
    return Counter(v for v, _ in await read_topic(s, EVENTS.name))


def having(s: Settings, n: int, task: asyncio.Task | None = None):
    """A check for `eventually`: whether `n` outputs are committed; fails at once if `task` ended."""
    async def check() -> bool:
        if task is not None and task.done():
            raise AssertionError(f"the worker exited: {task.exception()!r}")
        return sum((await outputs(s)).values()) >= n
    return check


async def stopped(runner: Runner, task: asyncio.Task) -> None:
    runner.stopping.set()
    await asyncio.wait_for(task, 30)


async def test_a_restarted_instance_aborts_the_transaction_its_predecessor_left_open(settings):
    s = isolated(settings, "it-restart.1")
    await ensure_topics(s)
    # The predecessor, killed mid-transaction: an output sent, its transaction never ended.
    predecessor = Runner(Copy(s), s)
    dead = producer(s.model_copy(update={"transaction_timeout_ms": ORPHAN_TIMEOUT_MS}),
                    transactional_id=predecessor.transactional_id)
    await dead.start()
    await dead.begin_transaction()
    await (await dead.send(s.topic(EVENTS.name), b"orphan", key=b"k", partition=0))
    values = [f"v{i}".encode() for i in range(N)]
    await publish(s, values)
    runner = Runner(Copy(s), s)  # the same instance, started again
    task = asyncio.create_task(runner.run())
    try:
        await eventually(having(s, N), timeout=60, interval=0.3)
    finally:
        await stopped(runner, task)
        await dead.stop()  # fenced: it closes without ending anything
    assert await outputs(s) == Counter(values)  # each once, and the orphan aborted


async def test_a_fenced_worker_drops_its_uncommitted_batch_rejoins_and_finishes_each_input_once(settings):
    s = isolated(settings, "it-fence.1")
    await ensure_topics(s)
    first, second = [f"a{i}".encode() for i in range(N)], [f"b{i}".encode() for i in range(N)]
    proc = Copy(s, hold_at=second[N // 2])
    runner = Runner(proc, s)
    task = asyncio.create_task(runner.run())
    intruder = None
    try:
        await publish(s, first)
        await eventually(having(s, N), timeout=60, interval=0.3)  # some work committed
        await publish(s, second)
        await asyncio.wait_for(proc.held.wait(), 60)  # mid-batch: processed, not committed
        # A second producer with the worker's id: its InitProducerId fences the worker's producer.
        intruder = producer(s, transactional_id=runner.transactional_id)
        await intruder.start()
        proc.go.set()
        await eventually(having(s, 2 * N, task), timeout=90, interval=0.3)
        assert len(runner.rejoined) == 1
        assert runner.processed > 2 * N  # the batch the fence refused was processed again
    finally:
        await stopped(runner, task)
        if intruder is not None:
            await intruder.stop()
    assert await outputs(s) == Counter(first + second)  # every input exactly one output, read committed
