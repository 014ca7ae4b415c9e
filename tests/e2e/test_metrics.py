"""Metrics, /health and /ready of every process (docs/reference/metrics.md), over real Kafka and Redis.

`test_every_process_exposes_its_metrics_and_they_move` runs a short load through a whole
stack (turns reviewed by the fake model: add, replace, delete, skip, a refusal, a 429 and a
malformed answer; a consolidation after a 500; HTTP writes, a search, a recall; a poison
command and a command the ledger rejects) and scrapes each process's own port.
`test_ready_waits_for_ledger_recovery_and_projection_catch_up` is in
tests/resilience/test_readiness.py.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from events import SessionEnded
from events.commands import DeleteMemory
from events.record import Provenance, Source
from services.client import MemlaneClient, TurnPublisher
from tests.conftest import eventually
from tests.e2e.extraction_support import answer, new_agent, send_commands, send_poison_command, turn
from tests.fakes.model_server import Raw, Reply
from tests.fakes.model_server import Status as HttpStatus
from tests.stacks import MODEL_API_PORT, MODEL_METRICS_BASE
from workers.runtime.metrics import PORT_INDEX

API_PORT = MODEL_API_PORT  # the model stack's API serves its own /metrics
METRICS_BASE = MODEL_METRICS_BASE  # the model stack's processes: METRICS_BASE + workers.runtime.metrics.PORT_INDEX


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
