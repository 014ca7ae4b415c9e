"""/ready of a restarted ledger and of a Redis projection behind the log: 503 with why while
the ledger recovers its partitions and the projection catches up with a 30,000-event backlog,
then 200 once done."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import uuid
from datetime import UTC, datetime

import httpx
from aiokafka import AIOKafkaProducer, TopicPartition

from events.codec import encode
from events.commands import AddMemory
from events.record import Provenance, Source
from events.topics import COMMANDS, EVENTS
from projections.redis.record_view import RedisRecords
from services.stack import free_port
from tests.conftest import eventually
from tests.redis_at import redis_at
from workers.runtime.kafka_io import reader
from workers.runtime.topic_reader import tp_key


async def _ready(p: int) -> tuple[int, list[str]]:
    async with httpx.AsyncClient(timeout=2) as h:
        try:
            r = await h.get(f"http://127.0.0.1:{p}/ready")
        except httpx.HTTPError:
            return 0, ["unreachable"]
    return r.status_code, r.json()["reasons"]


async def _watch(p: int, timeout: float = 120) -> list[tuple[int, list[str]]]:
    """Polls /ready until 200; returns every answer seen. Fails if it never gets there."""
    seen: list[tuple[int, list[str]]] = []

    async def ready():
        seen.append(await _ready(p))
        return seen[-1][0] == 200

    await eventually(ready, timeout=timeout, interval=0.02)
    return seen


async def _produce_commands(settings, n: int, agents: int) -> None:
    """`n` AddMemory commands over `agents` agents, sent in bulk (not one round trip each)."""
    p = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, linger_ms=20, acks=1)
    await p.start()
    try:
        futs = []
        now = datetime.now(UTC)
        for i in range(n):
            cmd = AddMemory(command_id=str(uuid.uuid4()), tenant="tready", agent=f"a{i % agents}", issued_at=now,
                            summary=f"Fact number {i} about item {i * 7919 % 100003}",
                            provenance=Provenance(source=Source.OPERATOR, modified_by="operator:test"))
            futs.append(await p.send(settings.topic(COMMANDS.name), encode(cmd), key=COMMANDS.key_bytes(cmd)))
        await asyncio.gather(*futs)
    finally:
        await p.stop()


async def _event_ends(settings) -> dict[TopicPartition, int]:
    c = reader(settings)
    await c.start()
    try:
        return await c.end_offsets([TopicPartition(settings.topic(EVENTS.name), p) for p in range(EVENTS.partitions)])
    finally:
        await c.stop()


async def _last_messages(settings, ends: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
    """The offset of the last message before `ends`, per partition that has one."""
    c = reader(settings)
    await c.start()
    try:
        tps = [tp for tp, end in ends.items() if end]
        c.assign(tps)
        for tp in tps:
            c.seek(tp, max(0, ends[tp] - 20))
        last: dict[TopicPartition, int] = {}
        while any([await c.position(tp) < ends[tp] for tp in tps]):
            for tp, msgs in (await c.getmany(timeout_ms=500)).items():
                for m in msgs:
                    if m.offset < ends[tp]:
                        last[tp] = m.offset
        return last
    finally:
        await c.stop()


# On the bare deployment (tests/stacks.py), last of its modules: its 30,000 records would wait
# for the embedding worker of any module after it.
async def test_ready_waits_for_ledger_recovery_and_projection_catch_up(bare_stack):
    stack, settings = bare_stack.stack, bare_stack.settings
    ports = {"ledger": free_port(), "redis-projection": free_port()}

    def start(name: str) -> None:
        stack.start(name, MEMLANE_METRICS_PORT=str(ports[name]), MEMLANE_METRICS_EVERY_S="0.5")

    ledger, projection = ports["ledger"], ports["redis-projection"]
    start("ledger")
    await _watch(ledger)  # the earlier modules' events recovered
    # A backlog of events: the ledger decides commands into them (no snapshot below 100,000 events).
    before = sum((await _event_ends(settings)).values())
    await _produce_commands(settings, 30_000, agents=300)

    async def decided():
        return sum((await _event_ends(settings)).values()) >= before + 30_000

    await eventually(decided, timeout=180, interval=0.5)
    stack.kill("ledger", signal.SIGTERM)

    # Restarted, it folds every event of its partitions before it decides anything: not ready meanwhile.
    start("ledger")
    seen = await _watch(ledger)
    recovering = [r for s, rs in seen if s == 503 for r in rs if r.startswith("ledger recovering partitions")]
    assert recovering, seen
    log = (stack.log_dir / "ledger.log").read_text()
    folded = [json.loads(line)["events"] for line in log.splitlines()
              if '"ledger_recovered"' in line and re.search(r'"events": ?[1-9]', line)]
    assert sum(folded) >= 30_000, folded

    # A Redis projection that starts now has the backlog to fold: not ready until it has.
    ends = await _event_ends(settings)
    start("redis-projection")
    seen = await _watch(projection)
    assert [r for s, rs in seen if s == 503 for r in rs if r.startswith("catching up")], seen
    records = RedisRecords(redis_at(settings.redis_url)(pooled=True), namespace=settings.topic_prefix)
    try:
        ckpt = await records.checkpoints()
    finally:
        await records.aclose()
    # Ready means the view holds everything the log held when the projection started (the
    # end offset itself is the last transaction's commit marker, never a message).
    last = await _last_messages(settings, ends)
    assert last and all(ckpt.get(tp_key(tp), 0) >= off + 1 for tp, off in last.items()), (ckpt, last)
