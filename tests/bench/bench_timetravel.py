"""timetravel: what reading the past, undoing, shadow replay, export and import cost.

One agent on a private stack (ledger, Redis projection, embedding worker, API):

- `import_records_per_s`: `memlane import` of a memlane export file of RECORDS agent records, each a
  write the ledger checks and the API waits for; checked by listing them all afterwards.
- `export_records_per_s`: `memlane export` of the same agent; checked by counting its record lines.
- `as_of_list_ms_p95` beside `list_ms_p95`: a first page of the listing as of now and without
  `as_of`, LISTS calls each, alternating; the two pages must be the same records. The as-of call
  folds the agent's event partition each time, so it grows with the log (docs/features/time-travel.md).
- `undo_ms`: `POST /v1/undo` of a turn that wrote 10 records; checked by its 10 changes applied.
- `as_of_search_ms_p95` beside `search_ms_p95` (`as_of_` figures at AGENT_RECORDS records in the
  agent, on a stack of its own): hybrid searches over HTTP, SEARCHES of each alternating, every
  query text distinct (each embeds its query), as of a point after the agent's first AGENT_RECORDS
  records and before CHANGED of them were deleted and CHANGED others added. Checked: the as-of
  answers hold only records of the point (deleted ones among them), the live ones no deleted
  record. `as_of_search_first_ms`: the first as-of search, which reads the log, folds it and
  builds the point's index; later ones find both kept.
- `export_records_per_s_100k`: `memlane export` of that agent's AGENT_RECORDS listed records, each
  with its versions; checked by counting them, none of them deleted.
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
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import numpy as np

from events import AgentConfig, Message, RecordAdded, TurnCommitted, encode
from events.codec import PLAIN
from events.memory import RecordDeleted
from events.record import MemoryRecord
from events.rules import portable
from events.topics import EVENTS, VECTORS
from events.vectors import VectorComputed
from projections.embedders.port import MODEL_ID, content_hash
from services.client import MemlaneClient, TurnPublisher
from tests.bench.bench_rebuild import _produce, vector_partition_of
from tests.bench.common import bench_stack, figure, percentile, progress
from tests.conftest import eventually
from tests.fakes.model_server import FakeModel, Reply
from workers.clients.model_client import ModelClient
from workers.jobs.shadow import Shadow, ShadowRun

AGENT_RECORDS = 100_000
CHANGED = 2_000
SEARCHES = 100
WORDS = "invoice shipping refund parcel customer account password billing order delivery address contract".split()
T0 = datetime(2026, 1, 1, tzinfo=UTC)
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
    await as_of_search_figures()


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


def _records(settings, first: int, n: int, rng):
    """Records `first`..`first + n - 1` of the big agent, each with its vector, as the pipeline
    writes them."""
    for i in range(first, first + n):
        text = f"{WORDS[i % 12]} {WORDS[(i // 12) % 12]} note {i} about case {i % 997}"
        vec = rng.standard_normal(384).astype(np.float32)
        v = VectorComputed.of(MODEL_ID, content_hash(text), vec / np.linalg.norm(vec))
        yield settings.topic(VECTORS.name), VECTORS.key_bytes(v), encode(v), vector_partition_of("big")
        r = MemoryRecord(id=f"r{i}", version=1, created=T0 + timedelta(seconds=i), modified=T0, tenant="bench",
                         agent="big", scope="AGENT", kind="fact", summary=text)
        e = RecordAdded(event_id=f"e{i}", command_id=f"c{i}", tenant="bench", agent="big", occurred_at=T0, record=r)
        yield settings.topic(EVENTS.name), EVENTS.key_bytes(e), encode(e)


def _deletes(settings, n: int):
    """Every 50th of the first records deleted: version 2, DELETED."""
    for i in range(0, n * 50, 50):
        text = f"{WORDS[i % 12]} {WORDS[(i // 12) % 12]} note {i} about case {i % 997}"
        r = MemoryRecord(id=f"r{i}", version=2, created=T0 + timedelta(seconds=i), modified=T0, tenant="bench",
                         agent="big", scope="AGENT", kind="fact", summary=text, status="DELETED")
        e = RecordDeleted(event_id=f"d{i}", command_id=f"cd{i}", tenant="bench", agent="big", occurred_at=T0,
                          record=r)
        yield settings.topic(EVENTS.name), EVENTS.key_bytes(e), encode(e)


async def _end_of_agent_partition(settings) -> str:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    partition = EVENTS.partition_of(b"bench/big")
    c = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap)
    await c.start()
    try:
        tp = TopicPartition(settings.topic(EVENTS.name), partition)
        return f"{partition}:{(await c.end_offsets([tp]))[tp]}"
    finally:
        await c.stop()


async def as_of_search_figures() -> None:
    with bench_stack("asof", workers=("ledger", "redis-projection")) as (stack, settings):
        async with MemlaneClient(stack.api_url, settings.operator_key, tenant="bench", agent="big") as op:
            key = await op.issue_key("bench", "big")
            await op.configure(CONFIG)
        rng = np.random.default_rng(11)
        await _produce(settings, _records(settings, 0, AGENT_RECORDS, rng))
        point = await _end_of_agent_partition(settings)
        await _produce(settings, _deletes(settings, CHANGED))
        await _produce(settings, _records(settings, AGENT_RECORDS, CHANGED, rng))
        deleted = {f"r{i}" for i in range(0, CHANGED * 50, 50)}
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=stack.api_url, headers=headers, timeout=600) as h:
            last = AGENT_RECORDS + CHANGED - 1  # written after the deletes: once both views hold it, they hold all

            async def loaded() -> bool:
                read = await h.get(f"/v1/memory/r{last}")
                found = await h.post("/v1/memory/search", json={"query": f"note {last}", "mode": "lexical"})
                if read.status_code == 200 and f"r{last}" in [x["id"] for x in found.json()["records"]]:
                    return True
                progress(f"loading: {(await h.get('/health')).json()['projection']['points']} points indexed")
                return False

            await eventually(loaded, timeout=900, interval=5)

            async def search(q: int, as_of: str | None) -> tuple[float, list[str]]:
                body = {"query": f"the {WORDS[q % 12]} {WORDS[(q * 7) % 12]} of case {q % 997} ({q})", "limit": 20,
                        "mode": "hybrid"} | ({"as_of": as_of} if as_of else {})
                t0 = time.perf_counter()
                got = await h.post("/v1/memory/search", json=body)
                ms = (time.perf_counter() - t0) * 1000
                got.raise_for_status()
                return ms, [x["id"] for x in got.json()["records"]]

            first_ms, _ = await search(-1, point)
            past, live, saw_deleted = [], [], 0
            for q in range(SEARCHES):
                ms, ids = await search(q, point)
                past.append(ms)
                assert ids and all(int(i[1:]) < AGENT_RECORDS for i in ids), "an as-of answer held a later record"
                saw_deleted += bool(deleted & set(ids))
                ms, ids = await search(q, None)
                live.append(ms)
                assert ids and not deleted & set(ids), "a live answer held a deleted record"
        assert saw_deleted, "no as-of answer held a record deleted after the point"
        figure("as_of_search_first_ms", first_ms, "ms", AGENT_RECORDS)
        figure("as_of_search_ms_p95", percentile(past, 95), "ms", SEARCHES, agent_records=AGENT_RECORDS,
               answers_with_deleted=saw_deleted)
        figure("search_ms_p95", percentile(live, 95), "ms", SEARCHES, agent_records=AGENT_RECORDS)
        figure("as_of_search_ratio_p95", percentile(past, 95) / percentile(live, 95), "x", SEARCHES,
               agent_records=AGENT_RECORDS)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "big.jsonl"
            t0 = time.perf_counter()
            r = await asyncio.to_thread(memlane, stack, "export", "--tenant", "bench", "--agent", "big",
                                        "--out", str(out))
            secs = time.perf_counter() - t0
            assert r.returncode == 0, r.stderr[-2000:]
            lines = [json.loads(x) for x in out.read_text().splitlines()]
        records = [x for x in lines if x["type"] == "record"]
        # The agent's listed records: those deleted are not exported, the ones added after are.
        assert len(records) == AGENT_RECORDS and not deleted & {x["id"] for x in records}, len(records)
        figure("export_records_per_s_100k", len(records) / secs, "records/s", len(records))
