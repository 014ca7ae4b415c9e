"""Delivers webhooks from the log: what memory events tell each tenant's registered endpoints.

It reads `memlane.memory.events` (and, for `turn.processed`, the review records of
`memlane.usage`) in a consumer group of its own and commits a partition only up to
its first event whose deliveries are not all done (delivered, or parked in the dead-letter topic
after the last attempt): a restart or a kill sends the rest again, with the same delivery ids, so
nothing is lost and a copy is recognisable. Each endpoint has a queue and a sender of its own, so
an endpoint that fails or stalls holds up no other: only its own queue waits, and what overflows
it is parked at once. Registrations and replays are read from their topics as they come.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from events.codec import Codec, ContractError
from events.commands import WORKSPACE
from events.lean import decode_logged
from events.rules import webhooks as rules
from events.sealing import KeyDestroyed, open_text, subject_of
from events.topics import EVENTS, USAGE, WEBHOOKS, WEBHOOKS_DEAD
from events.webhooks import WebhookParked, WebhookRegistered, WebhookReplayed
from projections.records import opening
from settings import Settings
from workers.runtime.topic_reader import TopicReader

log = structlog.get_logger()

BACKOFF_S = (0.5, 2.0, 8.0, 30.0)  # waits between attempts; after the last, the delivery is parked
ATTEMPT_TIMEOUT_S = 10.0
QUEUED = 1000  # deliveries an endpoint may have waiting; more are parked at once
COMMIT_EVERY_S = 0.5
TURN_RECORDS = (b'"TurnReviewed"', b'"MemorySkipped"')  # the usage records `turn.processed` is made of


def secret_aad(tenant: str, webhook_id: str) -> str:
    return f"webhook/{tenant}/{webhook_id}"


@dataclass
class Delivery:
    webhook: WebhookRegistered
    delivery_id: str
    kind: str
    body: str
    done: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Endpoint:
    webhook: WebhookRegistered
    secret: str
    queue: asyncio.Queue = field(default_factory=lambda: asyncio.Queue(QUEUED))
    task: asyncio.Task | None = None


class WebhookDelivery:
    def __init__(self, settings: Settings, codec: Codec, keys: Any = None, backoff_s: tuple[float, ...] = BACKOFF_S,
                 attempt_timeout_s: float = ATTEMPT_TIMEOUT_S) -> None:
        """`keys`: the keys topic's follower (`workers.runtime.data_keys.KeyTopic`), caught up on when a
        secret's key is not known here yet."""
        self.settings, self.codec, self.keys = settings, codec, keys
        self.backoff_s, self.attempt_timeout_s = backoff_s, attempt_timeout_s
        self.endpoints: dict[tuple[str, str], Endpoint] = {}
        self.parked: dict[str, WebhookParked] = {}  # delivery id -> what was parked, until replayed
        self.pending: dict[TopicPartition, dict[int, list[Delivery]]] = defaultdict(dict)
        self.stopping = asyncio.Event()
        self.delivered = 0
        self.http = httpx.AsyncClient(timeout=attempt_timeout_s)
        self.producer: AIOKafkaProducer | None = None
        self._tasks: set[asyncio.Future] = set()  # parkings of overflowing deliveries
        self.read_to: dict[str, int] = {}  # topic -> the position its follower has read to
        self.progressed = asyncio.Event()  # set each time a follower has read on

    # ---------------------------------------------------------------- the loop

    async def run(self) -> None:
        self.producer = AIOKafkaProducer(bootstrap_servers=self.settings.kafka_bootstrap, acks="all",
                                         enable_idempotence=True)
        await self.producer.start()
        consumer = AIOKafkaConsumer(
            self.settings.topic(EVENTS.name), self.settings.topic(USAGE.name), bootstrap_servers=self.settings.kafka_bootstrap,
            group_id=self.settings.topic("memlane.webhook-delivery"), enable_auto_commit=False,
            auto_offset_reset="earliest", isolation_level="read_committed")
        side = [asyncio.create_task(self._follow(WEBHOOKS.name, self._registration)),
                asyncio.create_task(self._follow(WEBHOOKS_DEAD.name, self._dead))]
        await consumer.start()
        try:
            last_commit = time.monotonic()
            while not self.stopping.is_set():
                batches = await consumer.getmany(timeout_ms=200, max_records=500)
                if batches:  # registrations written before these events are known before they are read
                    await self._registrations_read(consumer)
                for tp, msgs in batches.items():
                    for m in msgs:
                        await self._take(tp, m)
                if time.monotonic() - last_commit >= COMMIT_EVERY_S:
                    await self._commit(consumer)
                    last_commit = time.monotonic()
        finally:
            for t in side:
                t.cancel()
            await consumer.stop()
            await self.aclose()

    async def _registrations_read(self, consumer: AIOKafkaConsumer) -> None:
        tp = TopicPartition(self.settings.topic(WEBHOOKS.name), 0)
        end = (await consumer.end_offsets([tp]))[tp]
        while self.read_to.get(WEBHOOKS.name, 0) < end and not self.stopping.is_set():
            self.progressed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.progressed.wait(), 1.0)

    async def _take(self, tp: TopicPartition, m: Any) -> None:
        try:
            event = await self._decoded(tp, m)
        except ContractError as e:  # a poison message tells no webhook anything; its readers park it
            log.warning("webhook_event_skipped", topic=tp.topic, partition=m.partition, offset=m.offset, field=e.field)
            event = None
        except KeyDestroyed:  # its subject was erased since
            event = None
        deliveries: list[Delivery] = []
        for notice in rules.notices(event) if event is not None else ():
            for ep in self._endpoints_for(notice):
                did = rules.delivery_id(ep.webhook.webhook_id, m.partition, m.offset, notice.kind)
                told = notice
                if ep.webhook.include_text and rules.text_to_tell(notice, event.record):
                    opened = await self._opened(event.record)
                    told = notice if opened is None else rules.with_text(notice, opened)
                body = rules.body_of(did, told, datetime.fromtimestamp(m.timestamp / 1000, UTC).isoformat())
                d = Delivery(ep.webhook, did, notice.kind, body)
                deliveries.append(d)
                self._enqueue(ep, d)
        self.pending[tp][m.offset] = deliveries

    async def _decoded(self, tp: TopicPartition, m: Any) -> Any:
        """The event, or the usage record of a turn's review (others tell webhooks nothing and are
        not decoded: most usage records are retrievals)."""
        if not m.value:
            return None
        if tp.topic != self.settings.topic(USAGE.name):
            return decode_logged(m.value, m.headers)
        if not any(t in m.value for t in TURN_RECORDS):
            return None
        if self.keys is None:
            return self.codec.decode(USAGE.name, m.value)
        return await self.keys.opening(self.codec.decode, USAGE.name, m.value)

    async def _opened(self, record: Any) -> Any:
        """`record` with its text, or None when its key was destroyed (its subject erased since)."""
        if self.keys is None:
            return record
        try:
            return await self.keys.opening(record.opened, self.codec.cipher)
        except KeyDestroyed:
            return None

    def _endpoints_for(self, notice: rules.Notice) -> list[Endpoint]:
        return [ep for (tenant, _), ep in self.endpoints.items() if tenant == notice.tenant
                and notice.kind in ep.webhook.events and ep.webhook.agent in (None, notice.agent)]

    def _enqueue(self, ep: Endpoint, d: Delivery) -> None:
        try:
            ep.queue.put_nowait(d)
        except asyncio.QueueFull:
            self._spawn(self._park(d, 0, f"the endpoint had {QUEUED} deliveries waiting"))

    async def _commit(self, consumer: AIOKafkaConsumer) -> None:
        """Each partition up to its first event with a delivery not done."""
        offsets = {}
        for tp, by_offset in self.pending.items():
            if not by_offset:
                continue
            upto = max(by_offset) + 1
            for o in sorted(by_offset):
                if not all(d.done.is_set() for d in by_offset[o]):
                    upto = o
                    break
                del by_offset[o]
            offsets[tp] = upto
        if offsets:
            await consumer.commit(offsets)

    # ---------------------------------------------------------------- sending

    async def _send_all(self, ep: Endpoint) -> None:
        while True:
            d = await ep.queue.get()
            await self._send(ep, d)

    async def _send(self, ep: Endpoint, d: Delivery) -> None:
        error = ""
        for attempt, wait in enumerate((*self.backoff_s, None), start=1):
            ts = int(time.time())
            headers = {"Content-Type": "application/json", "Memlane-Webhook-Id": d.delivery_id,
                       "Memlane-Webhook-Timestamp": str(ts), "Memlane-Webhook-Signature": rules.signature(
                           ep.secret, ts, d.body), "Memlane-Webhook-Type": d.kind}
            try:
                resp = await self.http.post(ep.webhook.url, content=d.body, headers=headers,
                                            timeout=self.attempt_timeout_s)
                if 200 <= resp.status_code < 300:
                    self.delivered += 1
                    d.done.set()
                    return
                error = f"answered {resp.status_code}"
            except httpx.HTTPError as e:
                error = f"{type(e).__name__}"
            if wait is None:
                await self._park(d, attempt, error)
                return
            await asyncio.sleep(wait)

    async def _park(self, d: Delivery, attempts: int, error: str) -> None:
        parked = WebhookParked(tenant=d.webhook.tenant, webhook_id=d.webhook.webhook_id, delivery_id=d.delivery_id,
                               kind=d.kind, body=d.body, attempts=attempts, error=error, parked_at=datetime.now(UTC))
        assert self.producer is not None
        await self.producer.send_and_wait(self.settings.topic(WEBHOOKS_DEAD.name), self.codec.encode(parked),
                                          key=WEBHOOKS_DEAD.key_bytes(parked))
        log.warning("webhook_parked", tenant=d.webhook.tenant, webhook=d.webhook.webhook_id, attempts=attempts,
                    error=error)
        d.done.set()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---------------------------------------------------------------- registrations and replays

    async def _follow(self, topic: str, apply: Any) -> None:
        """Reads `topic` from its start and goes on reading what comes."""
        tp = TopicPartition(self.settings.topic(topic), 0)
        async with TopicReader(self.settings) as reader:
            await reader.assign([tp])
            while True:
                for msgs in (await reader.poll(tp, timeout_ms=200, max_records=500)).values():
                    for m in msgs:
                        try:
                            if m.value:
                                await apply(self.codec.decode(topic, m.value))
                        except Exception as e:  # one bad message must not stop the registrations after it
                            log.warning("webhook_message_skipped", topic=topic, offset=m.offset, error=type(e).__name__)
                self.read_to[topic] = await reader.position(tp)
                self.progressed.set()

    async def _registration(self, msg: Any) -> None:
        key = (msg.tenant, msg.webhook_id)
        old = self.endpoints.pop(key, None)
        if old is not None and old.task is not None:
            old.task.cancel()
        if isinstance(msg, WebhookRegistered):
            secret: str | None = msg.secret
            if self.codec.cipher is not None:
                secret = await opening(self.keys, open_text, self.codec.cipher, secret_aad(msg.tenant, msg.webhook_id),
                                       msg.secret)
            if secret is None:  # sealed under a destroyed key: the tenant was erased
                return
            ep = Endpoint(msg, secret)
            ep.task = asyncio.create_task(self._send_all(ep))
            self.endpoints[key] = ep

    async def _dead(self, msg: Any) -> None:
        if isinstance(msg, WebhookParked):
            self.parked[msg.delivery_id] = msg
        elif isinstance(msg, WebhookReplayed):
            for did in msg.delivery_ids:
                parked = self.parked.pop(did, None)
                ep = self.endpoints.get((msg.tenant, parked.webhook_id)) if parked else None
                if parked is not None and ep is not None:
                    self._enqueue(ep, Delivery(ep.webhook, did, parked.kind, parked.body))

    async def aclose(self) -> None:
        for ep in self.endpoints.values():
            if ep.task is not None:
                ep.task.cancel()
        await self.http.aclose()
        if self.producer is not None:
            await self.producer.stop()


def sealed_secret(codec: Codec, tenant: str, webhook_id: str, secret: str) -> str:
    """The secret as a registration carries it: sealed under the tenant's workspace key when the
    deployment encrypts (erasing the tenant makes it unreadable)."""
    if codec.cipher is None:
        return secret
    from events.sealing import seal_text

    return seal_text(codec.cipher, subject_of(tenant, WORKSPACE), secret_aad(tenant, webhook_id), secret)

