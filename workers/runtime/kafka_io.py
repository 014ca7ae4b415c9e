"""Kafka adapters shared by every worker: topic setup, producers, consumers, DLQ records."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from events.limits import MESSAGE_LIMIT
from events.topics import REPLIES, TOPICS, Topic
from settings import Settings

log = structlog.get_logger()


def new_topic(settings: Settings, name: str, partitions: int, config: dict[str, str] | None = None) -> NewTopic:
    """A topic as memlane creates it: the deployment's replication factor and, when set, its
    min.insync.replicas (with acks=all, how many copies a write needs before it is acknowledged)."""
    configs = dict(config or {})
    if settings.topic_min_insync_replicas:
        configs["min.insync.replicas"] = str(settings.topic_min_insync_replicas)
    return NewTopic(name, partitions, settings.topic_replication_factor, topic_configs=configs)


async def ensure_topics(settings: Settings, topics: Iterable[Topic] = TOPICS.values()) -> None:
    """Create memlane's topics and their dead-letter topics with the registry's partitions."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = []
        for t in topics:
            name = settings.topic(t.name)
            if name not in existing:
                wanted.append(new_topic(settings, name, t.partitions, t.config))
            if settings.topic(t.dlq) not in existing:
                wanted.append(new_topic(settings, settings.topic(t.dlq), 1))
        if settings.topic(REPLIES.name) not in existing:  # no worker consumes it: no dead letters
            wanted.append(new_topic(settings, settings.topic(REPLIES.name), REPLIES.partitions, REPLIES.config))
        for nt in wanted:
            try:
                await admin.create_topics([nt])
            except TopicAlreadyExistsError:
                pass
        if wanted:
            log.info("topics_created", topics=[t.name for t in wanted])
    finally:
        await admin.close()


async def delete_prefixed_topics(settings: Settings, prefix: str) -> list[str]:
    """Deletes every topic whose name starts with `prefix` (a finished test or bench run's)."""
    if not prefix:
        raise ValueError("an empty prefix would name every topic on the broker")
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        names = [t for t in await admin.list_topics() if t.startswith(prefix)]
        if names:
            await admin.delete_topics(names)
        return names
    finally:
        await admin.close()


async def ensure_log_topic(settings: Settings, topic: Topic) -> None:
    """A one-partition log the API processes follow (the API keys, the web sessions), created
    with its own configuration when missing."""
    name = settings.topic(topic.name)
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        if name not in set(await admin.list_topics()):
            try:
                await admin.create_topics([new_topic(settings, name, topic.partitions, topic.config)])
            except TopicAlreadyExistsError:
                pass
    finally:
        await admin.close()


async def stop_log_follower(task: asyncio.Task | None, stopping: asyncio.Event, producer: Any, consumer: Any) -> None:
    """Stops what `log_clients` opened and the task following it. The task is asked (`stopping`),
    not cancelled: a cancel that lands in the consumer's poll can leave it waiting."""
    if task is not None:
        stopping.set()
        done, _ = await asyncio.wait({task}, timeout=5)
        if not done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if consumer is not None:
        await consumer.stop()
    if producer is not None:
        await producer.stop()


async def log_clients(settings: Settings, tp: TopicPartition) -> tuple[AIOKafkaProducer, Any]:
    """A started producer, and a reader assigned to `tp` from its beginning: what a follower
    of a one-partition log (the data keys, the API keys) opens."""
    p = producer(settings)
    await p.start()
    c = reader(settings)
    await c.start()
    c.assign([tp])
    await c.seek_to_beginning(tp)
    return p, c


def producer(settings: Settings, transactional_id: str | None = None) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap,
        enable_idempotence=True,
        acks="all",
        linger_ms=0,
        transactional_id=transactional_id,
        transaction_timeout_ms=settings.transaction_timeout_ms,
        # Checked by the client before a message is sent, so an oversized one fails alone (one
        # the broker refused would leave a gap in the idempotent sequence for every later send).
        max_request_size=MESSAGE_LIMIT,
    )


def consumer(settings: Settings, *topics: str, group: str | None, gather_ms: int = 0) -> AIOKafkaConsumer:
    """`gather_ms`: the broker holds each fetch up to that long for more input (a batch per
    that much time under light load) instead of answering as soon as one message is there."""
    gather = {"fetch_max_wait_ms": gather_ms, "fetch_min_bytes": 1 << 20} if gather_ms else {}
    return AIOKafkaConsumer(
        *topics,
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        max_poll_records=500,
        session_timeout_ms=10_000,
        heartbeat_interval_ms=1_000,
        max_poll_interval_ms=300_000,
        **gather,
    )


def reader(settings: Settings, max_poll_records: int = 1000) -> AIOKafkaConsumer:
    """A group-less consumer for processes that own their partitions and their checkpoints
    (`workers.runtime.topic_reader.TopicReader` reads with one)."""
    return AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        max_poll_records=max_poll_records,
        fetch_max_wait_ms=100,
    )


def dlq_headers(topic: str, partition: int, offset: int, error: str, attempt: int) -> list[tuple[str, bytes]]:
    return [
        ("source_topic", topic.encode()),
        ("source_partition", str(partition).encode()),
        ("source_offset", str(offset).encode()),
        ("error", error[:2000].encode()),
        ("attempt", str(attempt).encode()),
    ]


async def require_topics(settings: Settings, topics: Iterable[Topic]) -> None:
    """Raise, saying what to do, when a topic a reader needs does not exist (yet)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
    finally:
        await admin.close()
    missing = [settings.topic(t.name) for t in topics if settings.topic(t.name) not in existing]
    if missing:
        raise RuntimeError(
            f"no topic {', '.join(missing)} on {settings.kafka_bootstrap}: nothing has been written under the topic "
            f"prefix {settings.topic_prefix!r} yet; start the pipeline (`memlane serve`) or set MEMLANE_TOPIC_PREFIX "
            "to your deployment's prefix"
        )


async def wait_for_broker(settings: Settings, timeout: float = 60) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, request_timeout_ms=3000)
        try:
            await admin.start()
            await admin.describe_cluster()
            return
        except Exception as e:
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(
                    f"Kafka at {settings.kafka_bootstrap} is not reachable; run `make up` or set MEMLANE_KAFKA_BOOTSTRAP"
                ) from e
            await asyncio.sleep(1)
        finally:
            await admin.close()
