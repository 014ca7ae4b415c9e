"""rebuild: both projections from the log alone (no model, no embedder), and ledger throughput."""

from __future__ import annotations

import asyncio
import json
import resource
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta

import numpy as np
from aiokafka import AIOKafkaProducer

from events import AddMemory, RecordAdded, encode
from events.record import MemoryRecord
from events.topics import COMMANDS, EVENTS, VECTORS, vector_partition
from events.vectors import VectorComputed
from projections.embedder import MODEL_ID, content_hash
from services.settings import ROOT, Settings
from tests.bench.common import discard, figure, median, progress
from workers.kafka_io import ensure_topics
from workers.ledger_rules import event_id, record_id_for

RECORDS = 100_000
AGENTS = 500
COMMANDS_N = 20_000
BOTH_RUNS = 3  # the two-process rebuild is the noisiest figure on a shared 2-core machine
T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def _produce(settings: Settings, items) -> None:
    p = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, linger_ms=50, max_batch_size=1 << 20,
                         max_request_size=8 << 20, compression_type=None)
    await p.start()
    try:
        for i, (topic, key, value, *partition) in enumerate(items):
            await p.send(topic, value, key=key, partition=partition[0] if partition else None)
            if i % 20_000 == 0:
                progress(f"produced {i}")
        await p.flush()
    finally:
        await p.stop()


def _log_items(settings: Settings):
    rng = np.random.default_rng(1)
    for i in range(RECORDS):
        agent = f"agent{i % AGENTS}"
        text = f"Record {i} of {agent}: the customer prefers option {i % 97} for shipping"
        vec = rng.standard_normal(384).astype(np.float32)
        vec /= np.linalg.norm(vec)
        v = VectorComputed.of(MODEL_ID, content_hash(text), vec)
        # Beside the agent's events, as the embedding worker writes it.
        yield settings.topic(VECTORS.name), VECTORS.key_bytes(v), encode(v), vector_partition_of(agent)
        # Ids and event ids as the ledger makes them (UUIDs: a point id needs no payload copy).
        r = MemoryRecord(id=record_id_for("bench", agent, f"c{i}"), version=1, created=T0 + timedelta(seconds=i), modified=T0 + timedelta(seconds=i),
                         tenant="bench", agent=agent, scope="AGENT", kind="fact", summary=text)
        e = RecordAdded(event_id=event_id("bench", agent, f"c{i}", 0), command_id=f"c{i}", tenant="bench", agent=agent, occurred_at=r.created,
                        record=r)
        yield settings.topic(EVENTS.name), EVENTS.key_bytes(e), encode(e)


def vector_partition_of(agent: str, tenant: str = "bench") -> int:
    return vector_partition(EVENTS.partition_of(f"{tenant}/{agent}".encode()))


def _bench_redis_url() -> str:
    """A database of its own: dropping a generation scans the database's keys, and the
    dev Redis also holds the recall bench's million records."""
    return Settings().redis_url.rsplit("/", 1)[0] + "/1"


def _rebuild_child(prefix: str, data_dir: str) -> dict:
    """Rebuild in a child process (as `memlane rebuild` does), so peak RSS is the rebuild's alone.

    First each projection alone, then both at once as `memlane rebuild` runs them."""
    code = f"""
import asyncio, json, time
from services.settings import Settings
from workers.rebuild import rebuild_all
s = Settings(topic_prefix={prefix!r}, data_dir={data_dir!r}, redis_url={_bench_redis_url()!r})
t0 = time.perf_counter(); asyncio.run(rebuild_all(s, targets=("redis",))); t1 = time.perf_counter()
asyncio.run(rebuild_all(s, targets=("qdrant",))); t2 = time.perf_counter()
both = []
for _ in range({BOTH_RUNS}):
    t3 = time.perf_counter(); asyncio.run(rebuild_all(s)); both.append(time.perf_counter() - t3)
print(json.dumps({{"redis_s": t1 - t0, "qdrant_s": t2 - t1, "both_s": both}}))
"""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    rss_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["peak_rss_mb"] = max(rss_kb, before) / 1024
    return result


async def _ledger_throughput() -> None:
    prefix = f"benchledger{uuid.uuid4().hex[:6]}."
    settings = Settings(topic_prefix=prefix, data_dir=ROOT / ".run" / prefix.rstrip("."))
    await ensure_topics(settings)
    cmds = [
        AddMemory(command_id=f"c{i}", tenant="bench", agent=f"agent{i % 200}", issued_at=T0, session="s",
                  summary=f"fact {i} about shipping option {i % 31}")
        for i in range(COMMANDS_N)
    ]
    await _produce(settings, ((settings.topic(COMMANDS.name), COMMANDS.key_bytes(c), encode(c)) for c in cmds))
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from services.stack import stack_env

    env = stack_env(MEMLANE_TOPIC_PREFIX=settings.topic_prefix, MEMLANE_LOG_LEVEL="WARNING")
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "worker", "ledger"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    c = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, group_id=None)
    await c.start()
    try:
        tps = [TopicPartition(settings.topic(EVENTS.name), p) for p in range(EVENTS.partitions)]
        while sum((await c.end_offsets(tps)).values()) < COMMANDS_N:  # markers add a few offsets
            await asyncio.sleep(0.5)
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        first, last, n = None, None, 0
        while n < COMMANDS_N:
            for ms in (await c.getmany(timeout_ms=1000, max_records=5000)).values():
                for m in ms:
                    first = m.timestamp if first is None else min(first, m.timestamp)
                    last = m.timestamp if last is None else max(last, m.timestamp)
                    n += 1
    finally:
        await c.stop()
        proc.terminate()
        proc.wait()
    secs = max((last - first) / 1000, 1e-3)
    figure("ledger_commands_per_s", COMMANDS_N / secs, "commands/s", COMMANDS_N)
    await _ledger_recovery(settings, n)
    discard(settings)


async def _ledger_recovery(settings: Settings, events: int) -> None:
    """How fast a ledger that is assigned partitions reads their state back with no
    snapshot (a new machine, or fewer events than a snapshot waits for): it folds its
    partitions of the event log from the start, so this rate and the log's length set how
    long a restarted or rebalanced ledger takes to start."""
    from services.logging import configure
    from workers.ledger import LedgerProcessor

    configure("WARNING")  # the per-partition lines would go to stderr among the progress
    ledger = LedgerProcessor(settings)
    t0 = time.perf_counter()
    for p in range(EVENTS.partitions):
        await ledger._recover(p)
    secs = time.perf_counter() - t0
    records = sum(len(s.records) for s in ledger.states.values())
    figure("ledger_recovery_events_per_s", events / secs, "events/s", events, records=records,
           partitions=EVENTS.partitions)


async def run() -> None:
    prefix = f"benchrebuild{uuid.uuid4().hex[:6]}."
    data_dir = str(ROOT / ".run" / prefix.rstrip("."))
    settings = Settings(topic_prefix=prefix, data_dir=data_dir)
    await ensure_topics(settings)
    t0 = time.perf_counter()
    await _produce(settings, _log_items(settings))
    progress(f"wrote {RECORDS} records and their vectors to the log in {time.perf_counter() - t0:.1f} s")
    r = await asyncio.to_thread(_rebuild_child, prefix, data_dir)
    runs = [round(RECORDS / b) for b in r["both_s"]]
    figure("rebuild_records_per_s", median(runs), "records/s", RECORDS, runs=runs,
           note=f"median of {BOTH_RUNS}: both projections rebuilt as `memlane rebuild` does, each memory shard's "
                "agents folded into Redis and Qdrant by a process of its own, switching over and dropping the "
                "generation before last")
    figure("rebuild_redis_records_per_s", RECORDS / r["redis_s"], "records/s", RECORDS)
    figure("rebuild_qdrant_records_per_s", RECORDS / r["qdrant_s"], "records/s", RECORDS)
    figure("projection_peak_rss_mb", r["peak_rss_mb"], "MB", RECORDS)
    await _drop_namespace(settings)
    discard(settings)
    await _ledger_throughput()


async def _drop_namespace(settings: Settings) -> None:
    import redis.asyncio as aioredis

    r = aioredis.from_url(_bench_redis_url())
    async for batch in _chunks(r.scan_iter(f"ml:{settings.topic_prefix}*", count=10_000), 10_000):
        await r.delete(*batch)
    await r.aclose()


async def _chunks(it, n):
    buf = []
    async for x in it:
        buf.append(x)
        if len(buf) >= n:
            yield buf
            buf = []
    if buf:
        yield buf
