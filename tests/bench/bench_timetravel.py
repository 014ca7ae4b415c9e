"""timetravel: what reading the past, undoing, shadow replay, export and import cost.

One agent on a private stack (ledger, Redis projection, embedding worker, API):

- `import_records_per_s`: `memlane import` of a memlane export file of RECORDS agent records, each a
  write the ledger checks and the API waits for; checked by listing them all afterwards.
- `export_records_per_s`: `memlane export` of the same agent; checked by counting its record lines.
- `as_of_list_ms_p95` beside `list_ms_p95`: a first page of the listing as of now and without
  `as_of`, LISTS calls each, alternating; the two pages must be the same records. The as-of call
  folds the agent's event partition each time, so it grows with the log (docs/features/time-travel.md).
- `undo_ms`: `POST /v1/undo` of a turn that wrote 10 records; checked by its 10 changes applied.
- `shadow_turns_per_s`: `memlane shadow`'s job in-process over SHADOW_TURNS recorded turns with an
  instant scripted model answering one candidate per turn; checked by its report (every turn
  reviewed, each adding one record).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import httpx

from events import AgentConfig, Message, TurnCommitted
from events.codec import PLAIN
from events.rules import portable
from services.client import MemlaneClient, TurnPublisher
from tests.bench.common import bench_stack, figure, percentile, progress
from tests.fakes.model_server import FakeModel, Reply
from workers.clients.model_client import ModelClient
from workers.jobs.shadow import Shadow, ShadowRun

RECORDS = 190  # with the undo's 10, the most live records an agent holds outside members' facts
LISTS = 60
SHADOW_TURNS = 200
CONFIG = AgentConfig.model_validate({"memory": {"scope": {"read": ["agent", "session"],
                                                          "write": ["agent", "session"]}}})


def export_file(path: Path, n: int) -> None:
    lines = [portable.header("src", "src", None, datetime.now(UTC).isoformat())]
    for i in range(n):
        lines.append({"type": "record", "id": f"r{i}", "versions": [
            {"id": f"r{i}", "version": 1, "tenant": "src", "agent": "src", "status": "ACTIVE", "kind": "fact",
             "scope": "AGENT", "summary": f"Fact {i}: the ticket {uuid.uuid4().hex[:8]} was closed", "content": ""}]})
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")


def memlane(stack, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "services.cli", *args], env=stack.env, capture_output=True,
                          text=True, timeout=3600)


async def listed(url: str, key: str) -> int:
    n, after = 0, None
    async with MemlaneClient(url, key) as c:
        while True:
            page = await c.list_memory(first=200, after=after)
            n += len(page["records"])
            if not (after := page["next_cursor"]):
                return n


async def run() -> None:
    with bench_stack("timetravel", workers=("ledger", "redis-projection", "embedding")) as (stack, settings):
        tenant, agent = "bench", f"tt{uuid.uuid4().hex[:6]}"
        async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
            key = await op.issue_key(tenant, agent)
            await op.configure(CONFIG)
        with tempfile.TemporaryDirectory() as tmp:
            src, out = Path(tmp) / "src.jsonl", Path(tmp) / "out.jsonl"
            export_file(src, RECORDS)
            progress(f"importing {RECORDS} records")
            t0 = time.perf_counter()
            r = await asyncio.to_thread(memlane, stack, "import", str(src), "--tenant", tenant, "--agent", agent)
            secs = time.perf_counter() - t0
            assert r.returncode == 0, r.stderr[-2000:]
            assert await listed(stack.api_url, key) == RECORDS, "the import did not write every record"
            figure("import_records_per_s", RECORDS / secs, "records/s", RECORDS)
            t0 = time.perf_counter()
            r = await asyncio.to_thread(memlane, stack, "export", "--tenant", tenant, "--agent", agent,
                                        "--out", str(out))
            secs = time.perf_counter() - t0
            assert r.returncode == 0, r.stderr[-2000:]
            records = sum(1 for x in out.read_text().splitlines() if json.loads(x)["type"] == "record")
            assert records == RECORDS, f"the export holds {records} records"
            figure("export_records_per_s", RECORDS / secs, "records/s", RECORDS)

        headers = {"Authorization": f"Bearer {key}"}
        now = datetime.now(UTC).isoformat()
        past, live = [], []
        async with httpx.AsyncClient(base_url=stack.api_url, headers=headers, timeout=60) as h:
            for _ in range(LISTS):
                t0 = time.perf_counter()
                a = (await h.get("/v1/memory", params={"as_of": now})).json()["records"]
                past.append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                b = (await h.get("/v1/memory")).json()["records"]
                live.append((time.perf_counter() - t0) * 1000)
                assert [x["id"] for x in a] == [x["id"] for x in b] and len(a) == 20
        figure("as_of_list_ms_p95", percentile(past, 95), "ms", LISTS, agent_records=RECORDS)
        figure("list_ms_p95", percentile(live, 95), "ms", LISTS, agent_records=RECORDS)

        async with MemlaneClient(stack.api_url, key, session="u1", turn=4) as c:
            for i in range(10):
                await c.add_memory(f"Said in turn 4, fact {i}", scope="AGENT")
        async with httpx.AsyncClient(base_url=stack.api_url, timeout=60, headers={
                "Authorization": f"Bearer {settings.operator_key}", "X-Tenant": tenant, "X-Agent": agent}) as h:
            t0 = time.perf_counter()
            done = (await h.post("/v1/undo", json={"turn": "u1/4"})).json()
            ms = (time.perf_counter() - t0) * 1000
        assert done.get("status") == "applied" and len(done["changes"]) == 10, done
        figure("undo_ms", ms, "ms", 10, agent_records=RECORDS + 10)

        await shadow_figure(stack, settings, tenant)


async def shadow_figure(stack, settings, tenant: str) -> None:
    agent = f"sh{uuid.uuid4().hex[:6]}"
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
        await op.configure(CONFIG)
    turns = [TurnCommitted(event_id=str(uuid.uuid4()), tenant=tenant, agent=agent, session="s1", turn=n,
                           execution_id="x1", occurred_at=datetime.now(UTC),
                           messages=[Message(id=f"m{n}", role="user", content=f"turn {n}: the build {n} is green"),
                                     Message(id=f"a{n}", role="assistant", content="Noted.")])
             for n in range(1, SHADOW_TURNS + 1)]
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
        await pub.publish_many(turns)
    fake = FakeModel().start()
    fake.default = lambda body: Reply({"candidates": [{
        "decision": "add", "handle": None, "kind": "fact", "labels": {}, "scope": "agent", "content": "",
        "summary": f"Build noted {uuid.uuid4().hex[:8]}", "source_message_ids": []}]})
    model = ModelClient(settings.model_copy(update={"openai_base_url": fake.url, "openai_api_key": "bench",
                                                    "model": "fake"}))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            shadow = Shadow(settings, PLAIN, None, model, Path(tmp))
            t0 = time.perf_counter()
            lines = await shadow.run(ShadowRun("bench", tenant, agent, "Keep builds.", "fake"))
            secs = time.perf_counter() - t0
    finally:
        await model.close()
        fake.stop()
    assert len(lines) == SHADOW_TURNS and all(len(x["shadow"]["added"]) == 1 for x in lines), lines[:3]
    figure("shadow_turns_per_s", SHADOW_TURNS / secs, "turns/s", SHADOW_TURNS)
