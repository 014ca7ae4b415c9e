"""`memlane status` on a running stack (real Kafka and Redis): every worker with its lag, the
dead-letter sizes (a poison command the ledger parks shows), the projection generations and
the model configuration without its secrets, as JSON and as the human table; and, with a
worker stopped, what is not ready."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from functools import partial

import pytest

from events.topics import COMMANDS, TOPICS
from services.stack import PIPELINE
from tests.conftest import ROOT, eventually
from tests.e2e.extraction_support import send_poison_command
from tests.redis_at import redis_at
from workers.runtime.heartbeat import heartbeat_key

SECRET = "sk-status-secret-4242"


@pytest.fixture(scope="module")
def sstack(model_stack):
    # The session's model stack, one process per worker (a test here kills one): its dead-letter
    # topics are shared with the other modules on it, so what is checked is this test's own letter.
    return model_stack


def status_env(stack) -> dict[str, str]:
    """The environment `memlane status` runs with: the stack's, the model's base URL carrying
    credentials in its user part and a secret API key (status shows the origin alone). Status
    reports its own process's model settings, so the stack's workers need not hold them."""
    url = stack.env["OPENAI_BASE_URL"].replace("://", f"://user:{SECRET}@")
    return {**stack.env, "OPENAI_BASE_URL": url, "OPENAI_API_KEY": SECRET, "COLUMNS": "250"}


def status(stack, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "services.cli", "status", *args], env=status_env(stack),
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def as_json(stack) -> dict:
    r = status(stack, "--json")
    assert r.returncode in (0, 1), r.stderr
    body = json.loads(r.stdout)
    assert r.returncode == (0 if body["ready"] else 1)
    return body


def dead_letters(stack) -> dict:
    """`memlane dlq list --json`: every dead-letter topic's size and messages (their keys)."""
    r = subprocess.run([sys.executable, "-m", "services.cli", "dlq", "list", "--json"], env=stack.env,
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


async def test_status_reports_workers_dead_letters_generations_and_the_model_without_secrets(sstack):
    stack, settings = sstack
    tenant, agent = f"tenstatus{uuid.uuid4().hex[:6]}", f"agentstatus{uuid.uuid4().hex[:6]}"
    await send_poison_command(settings, tenant, agent)
    key = f"{tenant}/{agent}"  # the commands' key: its dead letter keeps it

    async def parked():
        body, listed = await asyncio.gather(asyncio.to_thread(as_json, stack), asyncio.to_thread(dead_letters, stack))
        # A worker's lag is unknown (null) until its group has joined and the probe can read it, and
        # a process of a stack just started says it is not ready while it takes its partitions.
        settled = body["ready"] and all(isinstance(w["lag"], int) for w in body["workers"].values())
        mine = any(x["key"] == key for x in listed[COMMANDS.dlq]["messages"])
        # Both reads saw the same dead letters (no other module's landed between them).
        same = all(body["dlq"][t]["size"] == listed[t]["size"] for t in body["dlq"])
        return (body, listed) if mine and settled and same else None

    body, listed = await eventually(parked, timeout=60, interval=1)
    assert set(body["workers"]) == set(PIPELINE)
    for name, w in body["workers"].items():
        assert w["alive"] and isinstance(w["lag"], int) and w["group"].endswith(name), (name, w)
    assert set(body["dlq"]) == {t.dlq for t in TOPICS.values()}
    # The size is end minus beginning offset: a transactional writer's commit marker takes one too.
    # The topics are shared: this test's poison command is its one letter keyed to its agent.
    parked_here = listed[COMMANDS.dlq]["messages"]
    [mine] = [x for x in parked_here if x["key"] == key]
    assert body["dlq"][COMMANDS.dlq]["topic"] == settings.topic(COMMANDS.dlq)
    assert len(parked_here) <= body["dlq"][COMMANDS.dlq]["size"] <= 2 * len(parked_here)
    assert mine["replayed"] is None
    assert body["dlq"][COMMANDS.dlq]["replayed"] == sum(1 for x in parked_here if x["replayed"])
    assert not [x for t in TOPICS.values() if t.dlq != COMMANDS.dlq for x in listed[t.dlq]["messages"]
                if x["key"].startswith(f"{tenant}/")]
    assert body["projection"]["redis"]["generation"] >= 1
    assert body["projection"]["qdrant"]["generation"] >= 1 and body["projection"]["qdrant"]["exists"]
    assert body["projection"]["qdrant"]["age_s"] is not None
    m = body["model"]
    timeout_s = float(stack.env["MEMLANE_MODEL_TIMEOUT_S"])  # the stack's profile, not this process's default
    assert m["configured"] and m["model"] == settings.model and m["timeout_s"] == timeout_s
    assert m["base_url"] == fake_origin(stack) and m["embeddings"]["provider"] == "openai"
    assert body["api"]["reachable"] and body["ready"] == (not body["not_ready"])

    human = status(stack)
    out = human.stdout
    assert human.returncode == (0 if body["ready"] else 1), (body["not_ready"], human.stderr, out[-600:])
    for name in PIPELINE:
        assert f"\n{name} " in out
    [row] = [line for line in out.splitlines() if line.startswith(settings.topic(COMMANDS.dlq))]
    assert row.split()[1:] == [str(body["dlq"][COMMANDS.dlq]["size"]), str(body["dlq"][COMMANDS.dlq]["replayed"])]
    assert "redis record view" in out and "qdrant memory index" in out
    assert f"model {settings.model} (configured)" in out and fake_origin(stack) in out
    for shown in (out, json.dumps(body)):
        assert SECRET not in shown and "user:" not in shown


async def beating(settings, worker: str, pid: int) -> bool:
    """Whether the worker's heartbeat in Redis is the process `pid`'s."""
    r = redis_at(settings.redis_url, settings.redis_cluster)(decode_responses=False)
    try:
        beat = await r.get(heartbeat_key(settings, worker))
    finally:
        await r.aclose()
    return beat is not None and json.loads(beat).get("pid") == pid


async def lapse(settings, worker: str) -> None:
    """Moves the worker's heartbeat to the end of its TTL, as the time after its last beat would."""
    r = redis_at(settings.redis_url, settings.redis_cluster)(decode_responses=False)
    try:
        await r.pexpire(heartbeat_key(settings, worker), 1)
    finally:
        await r.aclose()


async def test_status_says_what_is_not_ready(sstack):
    stack, settings = sstack
    stack.kill("embedding")  # killed: its heartbeat lapses, and it stays registered
    await lapse(settings, "embedding")  # rather than wait out its TTL
    try:
        def dead():
            body = as_json(stack)
            return body if not body["workers"]["embedding"]["alive"] else None

        body = await eventually(dead, timeout=60, interval=1)
        assert not body["ready"] and any(x.startswith("worker embedding: no heartbeat") for x in body["not_ready"])
        human = status(stack)
        assert human.returncode == 1 and "Not ready:" in human.stdout
        row = next(line for line in human.stdout.splitlines() if line.startswith("embedding "))  # the workers' table
        assert row.split()[1] == "DEAD" and "worker embedding: no heartbeat" in human.stdout
    finally:
        # The stack is shared: the modules after this one find its embedding worker beating again.
        restarted = stack.start("embedding")
        await eventually(partial(beating, settings, "embedding", restarted.pid), timeout=60)


def fake_origin(stack) -> str:
    from services.pipeline_status import origin

    return origin(stack.env["OPENAI_BASE_URL"])
