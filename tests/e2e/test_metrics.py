"""Metrics, /health and /ready of every process (docs/metrics.md), over real Kafka and Redis.

`test_every_process_exposes_its_metrics_and_they_move` runs a short load through a whole
stack (turns reviewed by the fake model: add, replace, delete, skip, a refusal, a 429 and a
malformed answer; a consolidation after a 500; HTTP writes, a search, a recall; a poison
command and a command the ledger rejects) and scrapes each process's own port.
`test_ready_waits_for_ledger_recovery_and_projection_catch_up` gives a restarted ledger and a
fresh Redis projection a backlog, and sees /ready say 503 with why, then 200 once done.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import uuid
from datetime import UTC, datetime

import httpx
import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from events import SessionEnded
from events.codec import encode
from events.commands import AddMemory, DeleteMemory
from events.record import Provenance, Source
from events.topics import COMMANDS, EVENTS
from projections.redis_records import RedisRecords
from services.client import MemlaneClient, TurnPublisher
from services.stack import Stack, free_port, stack_env
from tests.conftest import eventually
from tests.e2e.extraction_support import answer, new_agent, send_commands, send_poison_command, turn
from tests.fakes.model_server import Raw, Reply
from tests.fakes.model_server import Status as HttpStatus
from tests.stacks import MODEL_API_PORT, MODEL_METRICS_BASE
from workers.kafka_io import reader
from workers.metrics import PORT_INDEX
from workers.topic_reader import tp_key

API_PORT = MODEL_API_PORT  # the model stack's API serves its own /metrics
METRICS_BASE = MODEL_METRICS_BASE  # the model stack's processes: METRICS_BASE + workers.metrics.PORT_INDEX
READY_BASE = MODEL_METRICS_BASE + 10  # the readiness test's own stack


def port(name: str, base: int = METRICS_BASE) -> int:
    return base + PORT_INDEX[name]


def scrape(p: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A process's /metrics as {(sample name, sorted labels): value}."""
    text = httpx.get(f"http://127.0.0.1:{p}/metrics", timeout=5).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(samples: dict, name: str, **labels: str) -> float | None:
    """The sum of `name`'s samples whose labels include `labels` (None: no such sample)."""
    hits = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls)]
    return sum(hits) if hits else None


def cand(decision: str, summary: str = "", handle: int | None = None, **kw) -> dict:
    return {"decision": decision, "handle": handle, "kind": kw.pop("kind", "fact"), "labels": {},
            "scope": "session", "summary": summary, "content": "", "source_message_ids": [], **kw}


@pytest.fixture(scope="module")
def mstack(model_stack):
    return model_stack

async def test_every_process_exposes_its_metrics_and_they_move(mstack, fake):
    stack, settings = mstack
    ma, mb = f"mk{uuid.uuid4().hex[:10]}", f"mk{uuid.uuid4().hex[:10]}"
    # Matched first: only a consolidation request names this schema. A 500, then an episode; then
    # it steps aside for the other modules' consolidations on the session's model server.
    fake.on('"name": "consolidation"', HttpStatus(500), Reply({
        "goal": "Upgrade the plan", "outcome": "successful", "success_score": 0.5,
        "summary": f"Upgraded the plan ({ma})", "procedure": None, "anti_pattern": None}), until_used=True)
    # A 429, a malformed answer (one repair), then add, replace, skip and a refusal (kind).
    fake.on(ma, HttpStatus(429), Raw("not json"), answer(
        cand("replace", f"Plan of account {ma} is Enterprise", handle=1),
        cand("add", f"Account {ma} renews in March"),
        cand("skip"),
        cand("add", f"Account {ma} likes tea", kind="no-such-kind")))
    fake.on(mb, answer(cand("delete", handle=1)))
    ta, a, _ = await new_agent(stack.api_url, settings.operator_key)
    tb, b, key_b = await new_agent(stack.api_url, settings.operator_key)
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=ta, agent=a, session="s1") as op:
        await op.add_memory(f"Plan of account {ma} is Basic")
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tb, agent=b, session="s1") as op:
        await op.add_memory(f"Warehouse {mb} ships on Sundays")
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
        await pub.publish(turn(ta, a, "s1", 1, f"We upgraded account {ma} plan to Enterprise; it renews in March",
                               "Great."))
        await pub.publish(turn(tb, b, "s1", 1, f"Correction: warehouse {mb} never ships on Sundays", "Understood."))
        await pub.publish(SessionEnded(event_id=str(uuid.uuid4()), tenant=ta, agent=a, session="s1",
                                       outcome="successful", occurred_at=datetime.now(UTC)))
    async with MemlaneClient(stack.api_url, key_b, session="s1") as c:
        await c.add_memory(f"Warehouse {mb} opens at 8")
        await c.search_memory(f"warehouse {mb}")
        await c.recall("c1", f"when does warehouse {mb} open?")
    await send_poison_command(settings, tb, b)
    await send_commands(settings, DeleteMemory(
        command_id=str(uuid.uuid4()), tenant=tb, agent=b, issued_at=datetime.now(UTC), record_id="no-such-record",
        provenance=Provenance(source=Source.OPERATOR, modified_by="operator:test")))

    # What each process must show: (metric, labels) whose value must be above zero.
    moved = {
        "extraction": [
            ("memlane_model_request_seconds_count", {"purpose": "memory", "outcome": "ok"}),
            ("memlane_model_request_seconds_count", {"purpose": "memory", "outcome": "error"}),
            ("memlane_model_request_seconds_count", {"purpose": "memory", "outcome": "malformed"}),
            ("memlane_model_tokens_total", {"purpose": "memory", "direction": "in"}),
            ("memlane_model_tokens_total", {"purpose": "memory", "direction": "out"}),
            ("memlane_model_errors_total", {"purpose": "memory", "reason": "rate_limited"}),
            ("memlane_model_errors_total", {"purpose": "memory", "reason": "malformed"}),
            ("memlane_model_retries_total", {"purpose": "memory", "why": "transient"}),
            ("memlane_model_retries_total", {"purpose": "memory", "why": "repair"}),
            *[("memlane_extraction_decisions_total", {"decision": d}) for d in ("add", "replace", "delete", "skip")],
            ("memlane_extraction_decisions_total", {"decision": "refused", "reason": "kind"}),
        ],
        "consolidation": [
            ("memlane_model_request_seconds_count", {"purpose": "consolidation", "outcome": "ok"}),
            ("memlane_model_tokens_total", {"purpose": "consolidation", "direction": "out"}),
            ("memlane_model_errors_total", {"purpose": "consolidation", "reason": "server_error"}),
            ("memlane_model_retries_total", {"purpose": "consolidation", "why": "transient"}),
        ],
        "ledger": [
            ("memlane_ledger_commands_total", {"command": "AddMemory"}),
            ("memlane_ledger_commands_total", {"command": "DeleteMemory"}),
            ("memlane_ledger_rejections_total", {}),
            ("memlane_dlq_messages_total", {"topic": "memlane.memory.commands.dlq"}),
        ],
        "embedding": [("memlane_embedding_calls_total", {"caller": "worker"}),
                      ("memlane_embedding_texts_total", {"caller": "worker"})],
        "redis-projection": [("memlane_projection_applied_total", {"projection": "redis"}),
                             ("memlane_projection_generation", {"projection": "redis"})],
        "history": [],
        "api": [
            ("memlane_embedding_calls_total", {"caller": "api"}),
            ("memlane_embedding_texts_total", {"caller": "api"}),
            ("memlane_search_seconds_count", {}),
            ("memlane_recall_seconds_count", {}),
            ("memlane_projection_generation", {"projection": "memory"}),
            ("memlane_projection_points", {"projection": "memory"}),
            ("memlane_projection_applied_total", {"projection": "memory"}),
            ("memlane_projection_points", {"projection": "history"}),
        ],
    }
    for worker in ("extraction", "consolidation", "ledger", "embedding", "redis-projection", "history"):
        moved[worker] += [("memlane_batch_seconds_count", {"worker": worker}),
                          ("memlane_messages_total", {"worker": worker})]
    for name in moved:
        moved[name].append(("memlane_ready", {"process": name}))

    def missing() -> dict[str, list]:
        out = {}
        for name, wanted in moved.items():
            try:
                got = scrape(port(name))
            except httpx.HTTPError as e:  # not serving yet
                out[name] = repr(e)
                continue
            lacking = [(m, ls) for m, ls in wanted if not (value(got, m, **ls) or 0) > 0]
            if lacking:
                out[name] = lacking
        return out

    last: dict = {}

    def all_moved():
        nonlocal last
        last = missing()
        return not last

    try:
        await eventually(all_moved, timeout=90, interval=0.5)
    except AssertionError:
        raise AssertionError(f"not moved: {last}") from None

    # Sampled gauges: consumer lag per partition of each worker's group, projection checkpoint lag.
    for worker in ("extraction", "consolidation", "ledger", "embedding", "redis-projection", "history"):
        got = scrape(port(worker))
        lags = [(ls, v) for (n, ls), v in got.items() if n == "memlane_consumer_lag"
                and dict(ls)["group"].endswith(f".{worker}")]
        assert len(lags) >= 8, (worker, lags)  # every topic it reads has 8 partitions
    assert value(scrape(port("redis-projection")), "memlane_projection_checkpoint_lag", projection="redis") is not None
    api = scrape(port("api"))
    for projection in ("memory", "history"):
        assert value(api, "memlane_projection_checkpoint_lag", projection=projection) is not None
    # The API's own port serves the same registry, and /ready beside /health.
    assert value(scrape(API_PORT), "memlane_search_seconds_count") == value(api, "memlane_search_seconds_count")
    for name in moved:
        for path in ("/health", "/ready"):
            r = httpx.get(f"http://127.0.0.1:{port(name)}{path}", timeout=5)
            assert r.status_code == 200, (name, path, r.text)
    r = httpx.get(f"{stack.api_url}/ready", timeout=5)
    assert (r.status_code, r.json()["status"]) == (200, "ready")
    # No label holds a tenant, an agent, a marker or any text of the load.
    for name in moved:
        text = httpx.get(f"http://127.0.0.1:{port(name)}/metrics", timeout=5).text
        (stack.log_dir / f"metrics-{name}.txt").write_text(text)  # kept with the logs, for a look
        for secret in (ta, a, tb, b, ma, mb, "Warehouse", "no-such-record"):
            assert secret not in text, (name, secret)


# ---------------------------------------------------------------------------------- readiness


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


# A stack of its own: its 30,000-command backlog on the session stack would be embedded and projected there
# (slowing every later module), and its Redis projection must start with no checkpoint (the whole log to fold).
@pytest.fixture(scope="module")
def rstack(infra, settings, tmp_path_factory):
    prefix = f"{settings.topic_prefix}r{uuid.uuid4().hex[:8]}."
    data = tmp_path_factory.mktemp("rdata")
    env = stack_env(MEMLANE_TOPIC_PREFIX=prefix, MEMLANE_DATA_DIR=str(data), MEMLANE_API_PORT=str(free_port()),
                    MEMLANE_METRICS_PORT_BASE=str(READY_BASE), MEMLANE_METRICS_EVERY_S="0.5", **infra)
    stack = Stack(env, data / "logs")
    s = settings.model_copy(update={"topic_prefix": prefix, "data_dir": data})
    try:
        yield stack, s
    finally:
        stack.stop()


async def test_ready_waits_for_ledger_recovery_and_projection_catch_up(rstack):
    stack, settings = rstack
    ledger, projection = port("ledger", READY_BASE), port("redis-projection", READY_BASE)
    stack.start("ledger")
    await _watch(ledger)  # nothing to recover yet
    # A backlog of events: the ledger decides commands into them (no snapshot below 100,000 events).
    await _produce_commands(settings, 30_000, agents=300)

    async def decided():
        return sum((await _event_ends(settings)).values()) >= 30_000

    await eventually(decided, timeout=180, interval=0.5)
    stack.kill("ledger", signal.SIGTERM)

    # Restarted, it folds every event of its partitions before it decides anything: not ready meanwhile.
    stack.start("ledger")
    seen = await _watch(ledger)
    recovering = [r for s, rs in seen if s == 503 for r in rs if r.startswith("ledger recovering partitions")]
    assert recovering, seen
    log = (stack.log_dir / "ledger.log").read_text()
    folded = [json.loads(line)["events"] for line in log.splitlines()
              if '"ledger_recovered"' in line and re.search(r'"events": ?[1-9]', line)]
    assert sum(folded) >= 30_000, folded

    # A Redis projection that starts now has the whole log to fold: not ready until it has.
    ends = await _event_ends(settings)
    stack.start("redis-projection")
    seen = await _watch(projection)
    assert [r for s, rs in seen if s == 503 for r in rs if r.startswith("catching up")], seen
    records = RedisRecords.from_url(settings.redis_url, namespace=settings.topic_prefix)
    try:
        ckpt = await records.checkpoints()
    finally:
        await records.aclose()
    # Ready means the view holds everything the log held when the projection started (the
    # end offset itself is the last transaction's commit marker, never a message).
    last = await _last_messages(settings, ends)
    assert last and all(ckpt.get(tp_key(tp), 0) >= off + 1 for tp, off in last.items()), (ckpt, last)
