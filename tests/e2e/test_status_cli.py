"""`memlane status` on a running stack (real Kafka and Redis): every worker with its lag, the
dead-letter sizes (a poison command the ledger parks shows), the projection generations and
the model configuration without its secrets, as JSON and as the human table; and, with a
worker stopped, what is not ready."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

from events.topics import COMMANDS, TOPICS
from services.stack import PIPELINE, free_port
from tests.conftest import ROOT, eventually
from tests.e2e.extraction_support import extraction_stack, send_poison_command

SECRET = "sk-status-secret-4242"


@pytest.fixture(scope="module")
def sstack(fake, infra, settings, tmp_path_factory):
    prefix = f"{settings.topic_prefix}s{uuid.uuid4().hex[:8]}."  # deleted with the run's topics
    # The base URL carries credentials in its user part: status shows the origin alone.
    url = fake.url.replace("://", f"://user:{SECRET}@")
    stack, ssettings = extraction_stack(url, prefix, tmp_path_factory.mktemp("sdata"), free_port(), **infra)
    stack.env["OPENAI_API_KEY"] = SECRET
    try:
        stack.start_all()
        yield stack, ssettings
    finally:
        stack.stop()


def status(stack, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "services.cli", "status", *args], env={**stack.env, "COLUMNS": "250"},
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def as_json(stack) -> dict:
    r = status(stack, "--json")
    assert r.returncode in (0, 1), r.stderr
    body = json.loads(r.stdout)
    assert r.returncode == (0 if body["ready"] else 1)
    return body


async def test_status_reports_workers_dead_letters_generations_and_the_model_without_secrets(sstack):
    stack, settings = sstack
    await send_poison_command(settings, "tenstatus", "agentstatus")

    def parked():
        # A worker's lag is unknown (null) until its group has joined and the probe can read it.
        body = as_json(stack)
        known = all(isinstance(w["lag"], int) for w in body["workers"].values())
        return body if body["dlq"][COMMANDS.dlq]["size"] and known else None

    body = await eventually(parked, timeout=60, interval=1)
    assert set(body["workers"]) == set(PIPELINE)
    for name, w in body["workers"].items():
        assert w["alive"] and isinstance(w["lag"], int) and w["group"].endswith(name), (name, w)
    assert set(body["dlq"]) == {t.dlq for t in TOPICS.values()}
    # The size is end minus beginning offset: a transactional writer's commit marker takes one too.
    assert body["dlq"][COMMANDS.dlq]["topic"] == settings.topic(COMMANDS.dlq)
    assert body["dlq"][COMMANDS.dlq]["size"] in (1, 2) and body["dlq"][COMMANDS.dlq]["replayed"] == 0
    assert all(body["dlq"][t.dlq]["size"] == 0 for t in TOPICS.values() if t.dlq != COMMANDS.dlq)
    assert body["projection"]["redis"]["generation"] >= 1
    assert body["projection"]["qdrant"]["generation"] >= 1 and body["projection"]["qdrant"]["exists"]
    assert body["projection"]["qdrant"]["age_s"] is not None
    m = body["model"]
    assert m["configured"] and m["model"] == settings.model and m["timeout_s"] == settings.model_timeout_s
    assert m["base_url"] == fake_origin(stack) and m["embeddings"]["provider"] == "openai"
    assert body["api"]["reachable"] and body["ready"] == (not body["not_ready"])

    human = status(stack)
    out = human.stdout
    assert human.returncode == (0 if body["ready"] else 1), human.stderr
    for name in PIPELINE:
        assert f"\n{name} " in out
    [row] = [line for line in out.splitlines() if line.startswith(settings.topic(COMMANDS.dlq))]
    assert row.split()[1:] == [str(body["dlq"][COMMANDS.dlq]["size"]), "0"]
    assert "redis record view" in out and "qdrant memory index" in out
    assert f"model {settings.model} (configured)" in out and fake_origin(stack) in out
    for shown in (out, json.dumps(body)):
        assert SECRET not in shown and "user:" not in shown


async def test_status_says_what_is_not_ready(sstack):
    stack, _ = sstack
    stack.kill("embedding")  # killed: its heartbeat lapses, and it stays registered
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
        stack.start("embedding")


def fake_origin(stack) -> str:
    from services.pipeline_status import origin

    return origin(stack.env["OPENAI_BASE_URL"])
