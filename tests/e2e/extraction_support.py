"""Support for the extraction tests and benchmark: a stack wired to the fake model server."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition

from events import AgentConfig, Message, TurnCommitted
from events.codec import ContractError, encode
from events.commands import GrantConsent, WithdrawConsent
from events.record import Provenance, Source
from events.sealing import KeyDestroyed
from events.topics import COMMANDS, TOPICS, Topic
from projections.redis.record_view import RedisRecords
from services.bootstrap import keys_at
from services.client import MemlaneClient
from services.stack import Stack, stack_env
from settings import Settings
from tests.conftest import eventually
from tests.fakes.model_server import Reply
from tests.redis_at import redis_at
from workers.runtime.data_keys import open_keys
from workers.runtime.topic_reader import TopicReader


def extraction_stack(fake_url: str, prefix: str, data_dir: Path, port: int, embeddings: str = "openai",
                     **extra: str) -> tuple[Stack, Settings]:
    settings = Settings(topic_prefix=prefix, data_dir=data_dir, api_port=port)
    env = stack_env(
        MEMLANE_TOPIC_PREFIX=prefix,
        MEMLANE_DATA_DIR=str(data_dir),
        MEMLANE_API_PORT=str(port),
        OPENAI_BASE_URL=fake_url,
        OPENAI_API_KEY="test-key",
        MEMLANE_EMBEDDINGS=embeddings,
        **extra,
    )
    return Stack(env, data_dir / "logs"), settings


def turn(tenant: str, agent: str, session: str | None, n: int, *texts: str, attempt: int = 1, **kw: Any) -> TurnCommitted:
    """A committed turn whose messages alternate user/assistant, ids `<session>-<n>-<i>`."""
    return TurnCommitted(
        event_id=str(uuid.uuid4()),
        tenant=tenant,
        agent=agent,
        session=session,
        turn=n,
        attempt=attempt,
        execution_id=f"exec-{session}",
        occurred_at=datetime.now(UTC),
        messages=kw.pop("messages", None)
        or [Message(id=f"{session}-{n}-{i}", role="user" if i % 2 == 0 else "assistant", content=t) for i, t in enumerate(texts)],
        **kw,
    )


async def new_agent(api_url: str, operator_key: str, config: AgentConfig | None = None) -> tuple[str, str, str]:
    tenant, agent = f"ten{uuid.uuid4().hex[:6]}", f"agent{uuid.uuid4().hex[:6]}"
    config = config or AgentConfig()
    async with MemlaneClient(api_url, operator_key, tenant=tenant, agent=agent) as op:
        key = await op.issue_key(tenant, agent)
        await op.configure(config)

        async def visible():  # the worker reads the configuration through the API
            return await op.config() == config

        await eventually(visible, timeout=30)
    return tenant, agent, key


async def read_topic(settings: Settings, topic: str, registry: str | None = None) -> list[tuple[Any, list]]:
    """Everything committed on a topic so far: (decoded value or raw bytes, headers)."""
    return [(v, h) for _, _, v, h in await read_topic_at(settings, topic, registry)]


async def read_topic_at(settings: Settings, topic: str, registry: str | None = None) -> list[tuple[int, int, Any, list]]:
    """Everything committed on a topic so far, with where: (partition, offset, value, headers).
    Sealed values are opened with the stack's data keys, loaded after the read, as a worker
    that meets them would have them."""
    name = settings.topic(topic)
    n = 1 if topic.endswith(".dlq") else TOPICS[topic].partitions
    async with TopicReader(settings) as c:
        raw = await c.read_all([TopicPartition(name, p) for p in range(n)])
    opening = keys_at(settings)()
    keys = await open_keys(settings, opening, follow=False)
    try:
        out = []
        for m in raw:
            try:
                value = opening.decode(registry, m.value) if registry else m.value
            except ContractError:
                continue  # another test's deliberately invalid message on a shared topic
            except KeyDestroyed:
                continue  # sealed for a subject another test on the shared topic erased
            if topic.endswith(".dlq") and isinstance(value, bytes):
                h = dict(m.headers)
                value = opening.unpark(value, "/".join(h[k].decode() for k in ("source_topic", "source_partition",
                                                                                  "source_offset")))
            out.append((m.partition, m.offset, value, m.headers))
        return out
    finally:
        if keys is not None:
            await keys.stop()


async def send_commands(settings: Settings, *commands: Any) -> None:
    """Commands straight onto `memlane.memory.commands`, keyed as memlane keys them."""
    await send_to(settings, COMMANDS, *commands)


async def send_poison_command(settings: Settings, tenant: str, agent: str) -> Any:
    """A command that breaks the contract, keyed to the agent: the ledger dead-letters it.
    Returns where it was written (its topic, partition and offset)."""
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap)
    await producer.start()
    try:
        return await producer.send_and_wait(settings.topic(COMMANDS.name), b'{"type": "AddMemory", "tenant": 1}',
                                            key=f"{tenant}/{agent}".encode())
    finally:
        await producer.stop()


async def send_atomically(settings: Settings, *commands: Any) -> None:
    """Commands in one Kafka transaction: the ledger (a read_committed consumer) sees all of
    them or none, so no scheduled job of its own can fall between two of them."""
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all",
                                transactional_id=f"test-{uuid.uuid4().hex}")
    await producer.start()
    try:
        async with producer.transaction():
            for m in commands:
                await producer.send(settings.topic(COMMANDS.name), encode(m), key=COMMANDS.key_bytes(m))
    finally:
        await producer.stop()


async def send_to(settings: Settings, topic: Topic, *messages: Any) -> None:
    """Messages straight onto `topic`, keyed as memlane keys them (a test standing in for a worker)."""
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, enable_idempotence=True, acks="all")
    await producer.start()
    try:
        for m in messages:
            await producer.send_and_wait(settings.topic(topic.name), encode(m), key=topic.key_bytes(m))
    finally:
        await producer.stop()


def consent_command(tenant: str, agent: str, user: str, grant: bool = True) -> GrantConsent | WithdrawConsent:
    """What a member's key sends (the ledger takes a grant from its member only)."""
    kind = GrantConsent if grant else WithdrawConsent
    return kind(command_id=str(uuid.uuid4()), tenant=tenant, agent=agent, user=user, issued_at=datetime.now(UTC),
                provenance=Provenance(source=Source.MEMBER, modified_by=f"member:{user}"))


async def set_consent(settings: Settings, tenant: str, agent: str, user: str, grant: bool = True) -> None:
    """Grants (or withdraws) a member's consent through the ledger, and waits until the
    record view, which the workers and the API read, holds it."""
    await set_consents(settings, [(tenant, agent, user)], grant)


async def set_consents(settings: Settings, subjects: list[tuple[str, str, str]], grant: bool = True) -> None:
    """`set_consent` for many (tenant, agent, user) subjects at once."""
    await send_commands(settings, *(consent_command(t, a, u, grant) for t, a, u in subjects))
    records = RedisRecords(redis_at(settings.redis_url)(pooled=True), namespace=settings.topic_prefix)
    want = "granted" if grant else "withdrawn"
    try:
        async def held():
            states = await asyncio.gather(*(records.subject(t, a, u) for t, a, u in subjects))
            return all(s.consent == want for s in states)

        await eventually(held, timeout=60)
    finally:
        await records.aclose()


def answer(*cands: dict) -> Reply:
    """The scripted model's answer: these review candidates."""
    return Reply({"candidates": list(cands)})
