"""rebuild: both projections from the log alone (no model, no embedder), and ledger throughput."""

from __future__ import annotations

import asyncio
import json
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import numpy as np
from aiokafka import AIOKafkaProducer

from events import AddMemory, CommandRejected, RecordAdded, encode
from events.codec import PLAIN, Codec
from events.record import MemoryRecord
from events.rules.ledger import event_id, record_id_for
from events.topics import COMMANDS, EVENTS, VECTORS, vector_partition
from events.vectors import VectorComputed
from projections.embedders.port import MODEL_ID, content_hash
from projections.qdrant.index import EdgeIndex
from projections.redis.record_view import RedisRecords
from services.bootstrap import index_generations, keys_at
from settings import ROOT, Settings
from tests.bench.common import discard, figure, median, progress
from tests.redis_at import redis_at
from workers.runtime.data_keys import open_keys
from workers.runtime.kafka_io import ensure_topics

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


def record_text(i: int, agent: str) -> str:
    return f"Record {i} of {agent}: the customer prefers option {i % 97} for shipping"


def _log_items(settings: Settings):
    rng = np.random.default_rng(1)
    for i in range(RECORDS):
        agent = f"agent{i % AGENTS}"
        text = record_text(i, agent)
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

    First each projection alone, then both at once as `memlane rebuild` runs them. After
    each rebuild the child waits, untimed, while this process counts what it built
    (`_check_built`): the next rebuild drops it, and one that read nothing would report a
    huge rate."""
    code = f"""
import asyncio, json, sys, time
from settings import Settings
from workers.jobs.rebuild import rebuild_all
from services.bootstrap import index_generations, keys_at
from tests.redis_at import redis_at
s = Settings(topic_prefix={prefix!r}, data_dir={data_dir!r}, redis_url={_bench_redis_url()!r})
def timed(targets):
    t0 = time.perf_counter(); built = asyncio.run(rebuild_all(s, redis_at(s.redis_url), index_generations(s), keys_at(s), targets=targets)); secs = time.perf_counter() - t0
    print(json.dumps({{"built": built}}), flush=True)
    sys.stdin.readline()
    return secs
redis_s = timed(("redis",))
qdrant_s = timed(("qdrant",))
both = [timed(("redis", "qdrant")) for _ in range({BOTH_RUNS})]
print(json.dumps({{"redis_s": redis_s, "qdrant_s": qdrant_s, "both_s": both}}), flush=True)
"""
    settings = Settings(topic_prefix=prefix, data_dir=data_dir, redis_url=_bench_redis_url())
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    result = None
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err, text=True, cwd=ROOT)
        try:
            for line in proc.stdout:
                msg = json.loads(line) if line.startswith("{") else {}
                if "built" in msg:
                    progress(f"rebuilt {msg['built']}: {_check_built(settings, msg['built'])}")
                    proc.stdin.write("\n")
                    proc.stdin.flush()
                elif "both_s" in msg:
                    result = msg
        finally:
            if proc.poll() is None and result is None:
                proc.kill()
            proc.wait()
        if proc.returncode or result is None:
            err.seek(0)
            raise RuntimeError(f"the rebuild process failed ({proc.returncode}): {err.read()[-2000:]}")
    rss_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    result["peak_rss_mb"] = max(rss_kb, before) / 1024
    return result


def qdrant_points(settings: Settings, gen: int) -> int:
    """The points of every shard of Qdrant generation `gen`."""
    n = 0
    for path in index_generations(settings).paths(gen):
        index = EdgeIndex(path)
        try:
            n += index.count()
        finally:
            index.close()
    return n


def _check_built(settings: Settings, built: dict[str, int]) -> dict[str, int]:
    """The records of each generation a rebuild built: every one of the log's, or it raises."""
    counts = {}
    if "redis" in built:
        counts["redis"] = asyncio.run(redis_records(settings, built["redis"]))
    if "qdrant" in built:
        counts["qdrant"] = qdrant_points(settings, built["qdrant"])
    if any(n != RECORDS for n in counts.values()):
        raise RuntimeError(f"the rebuild's generations {built} hold {counts} records, not the log's {RECORDS}")
    return counts


async def redis_records(settings: Settings, gen: int, records: int = RECORDS, agents: int = AGENTS,
                        codec: Codec = PLAIN) -> int:
    """Records listed in Redis generation `gen`, after reading a few back whole: opened by
    `codec`, the one a sealed log was written with."""
    store = RedisRecords(redis_at(settings.redis_url)(pooled=True), generation=gen, namespace=settings.topic_prefix,
                         codec=codec)
    try:
        for i in (0, records // 2, records - 1):
            agent = f"agent{i % agents}"
            r = await store.get("bench", agent, record_id_for("bench", agent, f"c{i}"))
            if r is None or r.summary != record_text(i, agent):
                raise RuntimeError(f"redis generation {gen} lacks record {i} of the log, or holds it changed")
        keys = [store._keys(gen, "bench", f"agent{a}")[1] for a in range(agents)]
        return sum(await asyncio.gather(*(store.r.zcard(k) for k in keys)))
    finally:
        await store.aclose()


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
    c = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, group_id=None, isolation_level="read_committed")
    await c.start()
    keys = None
    # The ledger seals what it logs: read it with the deployment's keys, those it made included.
    # The recovery below shares this codec, so it opens the log with the keys followed here.
    codec = keys_at(settings)()
    try:
        tps = [TopicPartition(settings.topic(EVENTS.name), p) for p in range(EVENTS.partitions)]
        while sum((await c.end_offsets(tps)).values()) < COMMANDS_N:  # markers add a few offsets
            await asyncio.sleep(0.5)
        keys = await open_keys(settings, codec)
        if keys is not None:
            await keys.catch_up()
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        first, last, n = None, None, 0
        outcome: dict[str, object] = {}  # command id -> its event: a rejection is an event too
        while len(outcome) < COMMANDS_N:
            for ms in (await c.getmany(timeout_ms=1000, max_records=5000)).values():
                for m in ms:
                    first = m.timestamp if first is None else min(first, m.timestamp)
                    last = m.timestamp if last is None else max(last, m.timestamp)
                    n += 1
                    e = codec.decode(EVENTS.name, m.value)
                    outcome[e.command_id] = e
    finally:
        await c.stop()
        proc.terminate()
        proc.wait()
    secs = max((last - first) / 1000, 1e-3)
    rejected = Counter(e.code for e in outcome.values() if isinstance(e, CommandRejected))
    applied = sum(not isinstance(e, CommandRejected) for e in outcome.values())
    if applied != COMMANDS_N:
        raise RuntimeError(f"the ledger applied {applied} of the bench's {COMMANDS_N} commands (rejected: "
                           f"{dict(rejected)}): the figure counts applied commands only")
    figure("ledger_commands_per_s", applied / secs, "commands/s", applied, rejected=sum(rejected.values()))
    try:
        await _ledger_recovery(settings, n, codec)
    finally:
        if keys is not None:
            await keys.stop()
    discard(settings)


async def _ledger_recovery(settings: Settings, events: int, codec: Codec) -> None:
    """How fast a ledger that is assigned partitions reads their state back with no
    snapshot (a new machine, or fewer events than a snapshot waits for): it folds its
    partitions of the event log from the start, so this rate and the log's length set how
    long a restarted or rebalanced ledger takes to start."""
    from settings.logging import configure
    from workers.processors.ledger.processor import LedgerProcessor

    configure("WARNING")  # the per-partition lines would go to stderr among the progress
    ledger = LedgerProcessor(settings, codec=codec)
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
