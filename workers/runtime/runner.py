"""One consume-process-produce loop that every worker runs.

- Messages that break the contract, or that keep failing, go to `<topic>.dlq` with headers,
  and the loop goes on. So does a message whose outputs the broker would refuse as too
  large: no output over the message limit ever reaches a transaction.
- Transient failures (Redis, Qdrant or Kafka unreachable) are retried with backoff. No
  offset is committed past the failure, so the worker catches up once the store is back.
- A transactional processor's outputs and its input offsets commit in one Kafka
  transaction: a crash anywhere leaves either all of a batch's effects or none.
- A poll's commit runs while the next poll is processed, and ends before that poll's own
  commit begins: batches still commit one at a time and in order, and a failed commit
  stops the worker before anything after it commits.
- A commit refused because the worker no longer owns its work (its producer fenced, its
  group moved on) drops what was not committed and rejoins the group, which resumes from the
  committed offsets; a worker refused again and again gives up (`too_many_rejoins`).

What a processor is and returns is in `workers.runtime.processor`; parking and the message
limit in `workers.runtime.parking`; ownership and rejoins in `workers.runtime.ownership`; and
running a poll's keys at once in `workers.runtime.concurrent_keys`.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterable
from dataclasses import replace
from typing import Any, cast

import structlog
from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from events.codec import ContractError
from events.sealing import KeyDestroyed, KeyMissing
from settings import Settings
from workers.runtime import metrics
from workers.runtime.concurrent_keys import by_key, release_key
from workers.runtime.data_keys import KeyTopic, open_keys
from workers.runtime.dlq import replay_group
from workers.runtime.faults import AFTER_COMMIT, BEFORE_COMMIT, Faults
from workers.runtime.heap import settle_heap
from workers.runtime.kafka_io import consumer, ensure_topics, producer
from workers.runtime.ownership import (
    REJOIN_LIMIT,
    REJOIN_WINDOW_S,
    Fenced,
    fenced_text,
    lost_ownership,
    too_many_rejoins,
    transactional_id,
)
from workers.runtime.parking import dead_letter, fits, fitting, message_size, oversized
from workers.runtime.processor import DeadLetter, Out, Processor, Stopping, Transient, until_folded
from workers.runtime.tracing import NO_TRACING, Tracing, carried

# Processors, the CLI and the tests import the runtime's names from here.
__all__ = [
    "REJOIN_LIMIT", "REJOIN_WINDOW_S", "DeadLetter", "Fenced", "Out", "Processor", "Runner", "Stopping", "Transient",
    "fits", "lost_ownership", "message_size", "metrics", "release_key", "too_many_rejoins",
    "transactional_id", "until_folded",
]

log = structlog.get_logger()

TRANSIENT = (
    RedisConnectionError,
    RedisTimeoutError,
    KafkaConnectionError,
    KafkaTimeoutError,
    ConnectionError,
    TimeoutError,
    OSError,
)
POISON_ATTEMPTS = 3


class _Listener(ConsumerRebalanceListener):
    def __init__(self, runner: Runner) -> None:
        self.runner = runner

    async def on_partitions_revoked(self, revoked):
        # What was processed before the revocation commits first, so the partitions' next
        # owner starts after it instead of doing it again.
        await self.runner.settle(quiet=True)
        await self.runner.processor.revoked(set(revoked))

    async def on_partitions_assigned(self, assigned):
        log.info("partitions_assigned", worker=self.runner.processor.name, partitions=sorted(p.partition for p in assigned))
        self.runner.assignments += 1
        self.runner.catch_up_to, self.runner.caught_up = None, False
        await self.runner.processor.assigned(self.runner.consumer, set(assigned))
        await self.runner.took(set(assigned))


class Runner:
    def __init__(self, processor: Processor, settings: Settings, group: str | None = None,
                 tracing: Tracing = NO_TRACING) -> None:
        self.processor = processor
        self.settings = settings
        self.tracing = tracing
        self.group = group or f"{settings.group_prefix}.{settings.topic_prefix}{processor.name}"
        self.stopping = processor.stopping
        self.consumer: Any = None
        self.producer: Any = None
        self.processed = 0
        self.unreadable = 0  # messages sealed under destroyed keys, skipped
        self.keys: KeyTopic | None = None
        self.committing: asyncio.Task | None = None  # the previous poll's commit, in flight
        self.commit_error: Exception | None = None
        self.faults = Faults(settings.fault_at)
        self.before_commit, self.after_commit = (f"{processor.name}.{p}" for p in (BEFORE_COMMIT, AFTER_COMMIT))
        # For /ready (`not_ready`): assignments so far, where the partitions ended when taken
        # (catch_up_on_start processors), whether the worker has read that far since, and
        # whether a poll's messages are being processed (positions then run ahead of the view).
        self.assignments = 0
        self.catch_up_to: dict[TopicPartition, int] | None = None
        self.caught_up = False
        self.in_batch = False
        self.transactional_id = (transactional_id(self.group, settings.worker_instance)
                                 if processor.transactional else None)
        self.rejoined: list[float] = []  # loop times of its rejoins, for `too_many_rejoins`

    def _registry_name(self, topic: str) -> str:
        p = self.settings.topic_prefix
        return topic[len(p) :] if p and topic.startswith(p) else topic

    async def run(self) -> None:
        s = self.settings
        await ensure_topics(s)
        self.keys = await open_keys(s, self.processor.codec)
        self.processor.keys = self.keys
        await self._open_producer()
        await self.processor.start()
        try:
            await self._open_consumer()
            log.info("worker_started", worker=self.processor.name, group=self.group, pid=os.getpid())
            while True:
                try:
                    await self._poll()
                    break
                except Exception as e:
                    if (lost := lost_ownership(e)) is None:
                        raise
                    if self.stopping.is_set():  # what it did not commit is the next owner's
                        log.info("commit_refused_while_stopping", worker=self.processor.name, reason=type(lost).__name__)
                        break
                    await self._rejoin(lost)
        finally:
            await self.settle(quiet=True)  # a batch processed in full still commits
            if self.consumer is not None:
                await self.consumer.stop()
            await self.processor.stop()
            await self.producer.stop()
            if self.keys is not None:
                await self.keys.stop()
            log.info("worker_stopped", worker=self.processor.name, processed=self.processed)

    async def _open_producer(self) -> None:
        # A transactional id's InitProducerId aborts the transaction its last holder left open.
        self.producer = producer(self.settings, transactional_id=self.transactional_id)
        await self.producer.start()

    async def _open_consumer(self) -> None:
        # Set before it starts: the listener reads it when the first assignment comes.
        self.consumer = consumer(self.settings, group=self.group, gather_ms=self.processor.gather_ms)
        self.consumer.subscribe([self.settings.topic(t) for t in self.processor.sources], listener=_Listener(self))
        await self.consumer.start()

    async def _poll(self) -> None:
        """Polls and processes until the worker stops; raises what a commit raised."""
        loop = asyncio.get_running_loop()
        next_tick = loop.time() + (self.processor.tick_every or 0)
        while not self.stopping.is_set():
            batches = {tp: msgs for tp, msgs in (await self.consumer.getmany(timeout_ms=300, max_records=500)).items() if msgs}
            if self.stopping.is_set():
                break  # stopped during the poll (a rebalance, a recovery): leave it uncommitted
            if self.committing is not None and self.committing.done():
                await self.settle()  # a failed commit is acted on now, not when the next batch comes
            self.in_batch = bool(batches)
            try:
                if self.processor.concurrent_keys:
                    # Partitions one after another would leave a processor that waits on I/O
                    # idle behind the slowest key of each partition; a key lives in one
                    # partition, so all of a poll's keys can run at once.
                    if batches:
                        await self._handle(batches)
                else:
                    for tp, msgs in batches.items():
                        await self._handle({tp: msgs})
            except Stopping:
                break
            self.in_batch = False
            if batches:
                settle_heap()
            if self.processor.tick_every is not None and loop.time() >= next_tick:
                next_tick = loop.time() + self.processor.tick_every
                await self._tick()

    async def _rejoin(self, lost: BaseException) -> None:
        """After a commit refused for ownership (`ownership.LOST_OWNERSHIP`): what was processed and not
        committed is dropped, the processor forgets its partitions as on a revocation, and a new
        producer (same transactional id) and a new group membership take over from the committed
        offsets, as a restart of the process would. Raises `Fenced` when refused too often."""
        now = asyncio.get_running_loop().time()
        reason = type(lost).__name__
        self.rejoined = [t for t in self.rejoined if now - t < REJOIN_WINDOW_S]
        if too_many_rejoins(self.rejoined, now):
            log.error("worker_fenced_too_often", worker=self.processor.name, group=self.group, reason=reason,
                      rejoins=len(self.rejoined), transactional_id=self.transactional_id)
            raise Fenced(fenced_text(self.processor.name, len(self.rejoined) + 1, lost, self.settings.worker_instance,
                                     self.transactional_id)) from lost
        self.rejoined.append(now)
        await self.settle(quiet=True)  # a commit still in flight ends first (refused too, most likely)
        self.commit_error = None
        partitions = set(self.consumer.assignment())
        log.warning("worker_rejoining", worker=self.processor.name, group=self.group, reason=reason,
                    partitions=sorted(p.partition for p in partitions), rejoin=len(self.rejoined),
                    of=REJOIN_LIMIT, transactional_id=self.transactional_id)
        consumer, self.consumer = self.consumer, None
        await consumer.stop()  # leaves the group: its partitions go to whoever joins, from their offsets
        self.in_batch, self.catch_up_to, self.caught_up = False, None, False
        await self.processor.revoked(partitions)  # its state of the uncommitted work goes too
        if self.processor.transactional:
            await self.producer.stop()  # a fenced producer is done for: aiokafka cannot start it again
            await self._open_producer()
        await self._open_consumer()

    async def _handle(self, batches: dict[TopicPartition, list[Any]]) -> None:
        """Processes the batches, then commits their outputs and next offsets at once.

        Several partitions in one Kafka transaction are still all-or-nothing. `max_records`
        bounds the whole poll, so no partition's uncommitted span grows past it.
        """
        msgs = [m for ms in batches.values() for m in ms]
        t0 = asyncio.get_running_loop().time()
        if self.processor.concurrent_keys and len(msgs) > 1:
            results = await by_key(msgs, self._one)
        else:
            results = [await self._one(m) for m in msgs]
        outs = [o for r in results for o in r]
        outs.extend(fitting(await self._retrying(self.processor.batch_done, "batch_done") or [], "batch_done"))
        metrics.BATCH_SECONDS.labels(self.processor.name).observe(asyncio.get_running_loop().time() - t0)
        metrics.MESSAGES.labels(self.processor.name).inc(len(msgs))
        # Committed in the background: the worker polls and processes the next batch
        # meanwhile. A commit is mostly round trips to the broker (the outputs, the offsets,
        # the end of the transaction), during which the worker had nothing else to do.
        await self.settle()
        self.committing = asyncio.create_task(self._commit({tp: ms[-1].offset + 1 for tp, ms in batches.items()}, outs))
        self.processed += len(msgs)

    async def _tick(self) -> None:
        outs = fitting(await self._retrying(self.processor.tick, "tick") or [], "tick")
        if outs:
            await self.settle()
            self.committing = asyncio.create_task(self._commit({}, outs))

    async def settle(self, quiet: bool = False) -> None:
        """Waits for the commit in flight, and raises what it raised.

        `quiet` (a rebalance, or stopping) only logs the failure and keeps it: the next
        `settle` raises it, so no later batch commits past the failed one.
        """
        task, self.committing = self.committing, None
        if task is not None:
            try:
                await task
            except Exception as e:
                self.commit_error = e
                if quiet and lost_ownership(e) is None:
                    log.exception("commit_failed", worker=self.processor.name)
                elif quiet:  # no trace: the rejoin that follows says what happened
                    log.info("commit_refused", worker=self.processor.name, reason=type(lost_ownership(e)).__name__)
        if self.commit_error is not None and not quiet:
            raise self.commit_error

    async def _one(self, m: Any) -> list[Out]:
        """`_message`; traced, in a span whose `traceparent` its outputs carry on."""
        if not self.tracing.enabled:
            return await self._message(m)
        with self.tracing.consumed(f"{self.processor.name} {self._registry_name(m.topic)}", getattr(m, "headers", None),
                                   **{"messaging.destination.name": m.topic, "messaging.kafka.partition": m.partition,
                                      "messaging.kafka.offset": m.offset}) as header:
            outs = await self._message(m)
        traced = [replace(o, headers=carried(o.headers, header)) for o in outs]
        return [t if fits(t) else o for t, o in zip(traced, outs, strict=True)]  # a full message goes untraced

    async def _message(self, m: Any) -> list[Out]:
        source = self._registry_name(m.topic)
        ctx = dict(topic=m.topic, partition=m.partition, offset=m.offset)
        if (group := replay_group(getattr(m, "headers", None))) is not None and group != self.group:
            return []  # an operator's replay (`memlane dlq replay`) is for the group that parked it
        try:
            value = await self._opening(self.processor.decode_message, source, m)
        except ContractError as e:
            log.warning("poison_message", error=str(e), field=e.field, **ctx)
            return [dead_letter(source, m, str(e), 1, self.group, self.processor.codec)]
        except KeyDestroyed:
            return self._unreadable(ctx)
        attempt = 0
        while True:
            try:
                try:
                    result = await self.processor.process(source, m.partition, m.offset, value)
                except KeyMissing:
                    # A cast, not an assert: a KeyMissing with no keys (encryption off) fails as it did.
                    await cast(KeyTopic, self.keys).catch_up()
                    result = await self.processor.process(source, m.partition, m.offset, value)
                outs = [dead_letter(source, m, o.error, o.attempt, self.group, self.processor.codec) if isinstance(o, DeadLetter) else o
                        for o in result]
                return outs if all(map(fits, outs)) else oversized(source, m, outs, ctx, self.group, self.processor.codec)
            except Stopping:
                raise
            except (KeyDestroyed, KeyMissing):
                return self._unreadable(ctx)
            except (Transient, *TRANSIENT) as e:
                await self._backoff(attempt, e, ctx)
                attempt += 1
            except Exception as e:  # a message this code cannot handle: park it, keep going
                attempt += 1
                log.exception("message_failed", attempt=attempt, **ctx)
                if attempt >= POISON_ATTEMPTS:
                    return [dead_letter(source, m, f"{type(e).__name__}: {e}", attempt, self.group,
                                        self.processor.codec)]

    async def _opening(self, fn, *args):
        return fn(*args) if self.keys is None else await self.keys.opening(fn, *args)

    def _unreadable(self, ctx: dict) -> list[Out]:
        """A message sealed under a destroyed key (its subject was erased): nothing to do."""
        self.unreadable += 1
        log.info("sealed_message_unreadable", **ctx)
        return []

    async def _retrying(self, fn, what: str) -> Any:
        attempt = 0
        while True:
            try:
                return await fn()
            except (Transient, *TRANSIENT) as e:
                await self._backoff(attempt, e, {"step": what})
                attempt += 1

    async def _backoff(self, attempt: int, e: Exception, ctx: dict) -> None:
        delay = min(0.2 * 2**attempt, 5.0)
        log.warning("dependency_unavailable_retrying", error=f"{type(e).__name__}: {e}", delay_s=delay, **ctx)
        await asyncio.sleep(delay)

    async def _send_all(self, outs: Iterable[Out]) -> list[Any]:
        futs = [
            await self.producer.send(
                self.settings.topic(o.topic), o.value, key=o.key, headers=list(o.headers), partition=o.partition
            )
            for o in outs
        ]
        # gather: when one fails (a fenced producer fails them all), the others' errors count as
        # seen, instead of each logging "Future exception was never retrieved".
        return list(await asyncio.gather(*futs))

    async def _commit(self, offsets: dict[TopicPartition, int], outs: list[Out]) -> None:
        if self.keys is not None:
            await self.keys.flush()  # the keys first: nothing sealed under a key that could be lost
        if self.processor.transactional:
            async with self.producer.transaction():
                written = await self._send_all(outs)
                if offsets:
                    await self.producer.send_offsets_to_transaction(offsets, self.group)
                    self.faults.reached(self.before_commit)
        else:
            written = await self._send_all(outs)
            if offsets:
                self.faults.reached(self.before_commit)
                await self.consumer.commit(offsets)
        if offsets:
            self.faults.reached(self.after_commit)
        for o in outs:
            if o.topic.endswith(".dlq"):
                metrics.DLQ_MESSAGES.labels(o.topic).inc()
        self.processor.committed(written)

    async def took(self, partitions: set[TopicPartition]) -> None:
        """After the processor took an assignment: where a `catch_up_on_start` worker must read to."""
        self.catch_up_to = await self.consumer.end_offsets(list(partitions)) if (
            self.processor.catch_up_on_start and partitions) else {}

    async def not_ready(self) -> list[str]:
        """Why the worker is not ready (docs/reference/metrics.md): not in its group yet, the processor's
        own reasons (the ledger recovering), or not yet read up to where its partitions ended
        when it took them. Empty once ready; caught up stays so until the next assignment."""
        c = self.consumer
        if c is None or not self.assignments:
            return ["no partitions assigned yet (joining the consumer group)"]
        reasons = self.processor.not_ready({tp.partition for tp in c.assignment()})
        if reasons:
            return reasons
        if self.catch_up_to is None:
            return ["taking its partitions"]
        if not self.caught_up:
            assignment = self.assignments
            behind = 0
            for tp, end in self.catch_up_to.items():
                behind += max(0, end - await c.position(tp))
            if behind or self.in_batch or assignment != self.assignments:
                return [f"catching up: {behind} messages behind where its partitions ended when assigned"]
            self.caught_up = True
        return []

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)

