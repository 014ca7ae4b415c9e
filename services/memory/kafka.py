"""The memory service's ports on Kafka: commands to `memlane.memory.commands`, usage to `memlane.usage`."""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, MessageSizeTooLargeError

from events.codec import Codec
from events.errors import ErrorCode
from events.limits import MESSAGE_LIMIT, largest_field, too_large
from events.topics import COMMANDS, USAGE
from services.errors import ApiError
from settings import Settings
from workers.runtime.data_keys import KeyTopic
from workers.runtime.kafka_io import producer as kafka_producer
from workers.runtime.tracing import NO_TRACING, Tracing

log = structlog.get_logger()


class KafkaCommandPublisher:
    """Sends commands with one producer, renewed when a failed send left it unusable."""

    def __init__(self, settings: Settings, producer: AIOKafkaProducer, codec: Codec,
                 keys: KeyTopic | None = None, tracing: Tracing = NO_TRACING) -> None:
        self.settings = settings
        self.producer = producer
        self.codec = codec
        self.keys = keys
        self.tracing = tracing  # a command carries on the trace of the request that sent it
        self._renewing = asyncio.Lock()
        self._closing: set[asyncio.Future] = set()

    async def send(self, cmd: Any, data: bytes) -> None:
        """Sends `data` once, or twice when the first send failed and left the producer
        unusable: the ledger applies a command id of an agent once, so a second copy is
        harmless. A failed send that the broker refused leaves a gap in the idempotent
        producer's sequence, and every later send to that partition would then fail with
        OutOfOrderSequenceNumber; a fresh producer starts a new sequence."""
        if self.keys is not None:
            await self.keys.flush()  # the key a sealed command needs goes first
        for attempt in (1, 2):
            used = self.producer
            try:
                await used.send_and_wait(self.settings.topic(COMMANDS.name), data, key=COMMANDS.key_bytes(cmd),
                                         headers=list(self.tracing.current()))
                return
            except KafkaError as e:
                log.warning("command_send_failed", error=type(e).__name__, retriable=e.retriable, attempt=attempt)
                if not e.retriable:
                    await self._renew_producer(used)
                if isinstance(e, MessageSizeTooLargeError):
                    field = largest_field(cmd)
                    raise ApiError(ErrorCode.LIMIT_EXCEEDED, field,
                                   too_large("the command", len(data), MESSAGE_LIMIT, field), 413) from None
                if e.retriable or attempt == 2:
                    raise ApiError(ErrorCode.UNAVAILABLE, None, "the command could not be written to the log; send it "
                                   f"again with the same command_id ({cmd.command_id}), which applies it once",
                                   503) from None

    async def _renew_producer(self, failed: AIOKafkaProducer) -> None:
        """Replaces `failed` unless a concurrent request already did; the old one is closed
        in the background, its own pending sends failing or completing as they will."""
        async with self._renewing:
            if self.producer is not failed:
                return
            fresh = kafka_producer(self.settings)
            await fresh.start()
            self.producer = fresh
        log.warning("command_producer_renewed")
        closing = asyncio.ensure_future(asyncio.wait_for(failed.stop(), timeout=10))
        self._closing.add(closing)
        # The tuple only sequences the two calls, so discard's None is meant to be in it.
        closing.add_done_callback(
            lambda t: (self._closing.discard(t), t.cancelled() or t.exception()))  # type: ignore[func-returns-value]

    async def stop(self) -> None:
        await self.producer.stop()


class KafkaUsageRecorder:
    """Enqueues usage records on the command publisher's current producer (renewed with it)."""

    def __init__(self, settings: Settings, commands: KafkaCommandPublisher) -> None:
        self.settings = settings
        self.commands = commands

    async def record(self, usage: Any) -> None:
        data = self.commands.codec.encode(usage)
        if self.commands.keys is not None:
            await self.commands.keys.flush()
        await self.commands.producer.send(self.settings.topic(USAGE.name), data, key=USAGE.key_bytes(usage))
