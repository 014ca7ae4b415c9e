"""encryption: what sealing personal fields costs (docs/features/encryption-and-erasure.md), how soon an erasure
takes hold, and the nightly retention sweep.

`encryption_overhead_pct` compares one workload with and without encryption in the same
run, on two deployments alike but for `MEMLANE_ENCRYPTION=0` in one. The runs alternate
(with, without, without, with, ...), so the machine's drift over minutes reaches both alike;
each side's figure is the median of its runs, and the overhead is
`(rate_off / rate_on - 1) * 100` (for recall, `(p50_on / p50_off - 1) * 100`). Each also
gives the CPU per unit of work on both sides, which other load on the machine moves less
than it moves wall time, and (extraction, rebuild) `paired_pct`, the median of each
repeat's own overhead. Before a figure is printed, each side is checked to be what it
claims: every record event on the sealed side's log carries a `sealed` token, none on the
plain side's.

- `on: "extraction"`: two extraction stacks (bench_extraction's, the fake model serving
  chat and embeddings). After a warm-up burst each, `EXTRACTION_REPEATS` bursts of
  `EXTRACTION_TURNS` turns per stack, alternating, each started once the one before is
  searchable (bench_extraction's `burst` and `drained`: rate = turns over the time from
  just before the first turn is published to the Kafka timestamp of the last forwarded
  outcome). `worker_cpu_ms_per_turn_on`/`_off`: the extraction worker's own CPU per turn.
- `on: "rebuild"`: the same `REBUILD_RECORDS` records (and their vectors) over
  `REBUILD_AGENTS` agents produced into two logs, one sealed by this process (a codec whose
  keyring `open_keys` loaded from that log's prefix, the keys published before the events,
  the vectors keyed and sealed as the embedding worker writes them), one plaintext. Each
  run is a `memlane rebuild` of both projections in a child process (encryption off in the
  plaintext one's), timed inside the child; between runs this process counts what it built
  and reads records back whole (bench_rebuild's check).
- `on: "recall"`: two deployments (API, ledger, Redis projection) of `RECALL_RECORDS`
  records on one agent written through the log as bench_recall does, plain and sealed;
  `RECALL_QUERIES` sequential recalls over HTTP on each, alternating query by query, after
  `RECALL_WARMUP` discarded ones; each answer must hold records, as written.
  `api_cpu_ms_per_recall_on`/`_off`: the API process's CPU per recall.

`erasure_to_unreadable_s`: on the sealed extraction stack, a member of a new agent
(user-scope facts, consent not required so that the withdrawal an erasure makes gates
nothing) with `ERASE_FACTS` facts written over HTTP and a turn (a history message, which
extraction makes one more fact of). Timed from just before `DELETE /v1/subjects/{user}`
(which answers once the record view shows the erasure, and must count every fact) until
both hold: the member's list, lexical memory search, recall and history search return
nothing and `GET /v1/subjects` counts no facts for them (polled: `projections_s`), and
every data key of the member's subject is tombstoned on the keys topic (`keys_s`, from the
tombstones' Kafka timestamps: a fresh keyring takes tenths of a second to load, more than
what is timed). Then a fresh keyring (a new codec's, loaded once by `open_keys`)
must not know the subject, and the projections must still serve nothing. Median of `ERASURES`.

`retention_sweep_records_per_s`: the pure part of the nightly retention, without the broker
(what the ledger worker runs on each partition's state at the night's hour): a `LedgerState`
of `RETENTION_RECORDS` records over agents of 200, a known share of them tombstones deleted
more than 180 days ago, others deleted lately or live. Timed: `due(state, now)` and
deciding and folding every command it picks.
Checked: exactly the old tombstones were purged, and nothing else moved. Records per second
is the state's records over that time (a night reads every one). Median of
`RETENTION_RUNS`, each on a fresh copy of the state.

`MEMLANE_BENCH_ENCRYPTION_SCALE` (default 1) scales every size, for a quick run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import numpy as np
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, TopicPartition

from events import RecordAdded, RecordDeleted
from events.codec import PLAIN, Codec
from events.config import AgentConfig
from events.record import MemoryRecord, Status
from events.rules.ledger import LedgerState, decide, event_id, evolve, record_id_for
from events.rules.ledger.retention import RETENTION, due
from events.sealing import SEALED_MARK, subject_of
from events.topics import EVENTS, VECTORS, keys_topic
from events.vectors import VectorComputed, keyed_hash
from projections.embedders.port import MODEL_ID, content_hash
from projections.redis.record_view import RedisRecords
from services.bootstrap import keys_at
from services.client import MemlaneClient, TurnPublisher
from services.stack import free_port
from settings import ROOT, Settings
from tests.bench import bench_extraction as bx
from tests.bench.bench_rebuild import _bench_redis_url, _produce, qdrant_points, record_text, vector_partition_of
from tests.bench.bench_rebuild import redis_records as rebuild_redis_records
from tests.bench.common import bench_stack, discard, figure, median, percentile, progress
from tests.e2e.extraction_support import extraction_stack, new_agent, turn
from tests.fakes.model_server import FakeModel
from tests.redis_at import redis_at
from workers.runtime.data_keys import open_keys
from workers.runtime.kafka_io import ensure_topics

# A keys topic just made is "not found in cluster metadata" a few times: noise among the progress.
logging.getLogger("aiokafka.cluster").addFilter(
    lambda r: not (r.msg.startswith("Topic %s not found") and str(r.args[0]).endswith("memlane.keys")))
SCALE = float(os.environ.get("MEMLANE_BENCH_ENCRYPTION_SCALE", "1"))


def scaled(n: int, least: int = 1) -> int:
    return max(least, int(n * SCALE))


EXTRACTION_TURNS = scaled(1000, 100)
EXTRACTION_WARMUP = scaled(500, 100)
EXTRACTION_REPEATS = 5
REBUILD_RECORDS = scaled(50_000, 1000)
REBUILD_AGENTS = max(5, REBUILD_RECORDS // 200)
REBUILD_RUNS = 5
RECALL_RECORDS = scaled(20_000, 1000)
RECALL_QUERIES = scaled(300, 30)
RECALL_WARMUP = scaled(30, 10)
ERASURES = 5
ERASE_FACTS = 5
RETENTION_RECORDS = scaled(100_000, 2000)
RETENTION_RUNS = 5
T0 = datetime(2026, 1, 1, tzinfo=UTC)
OFF = {"MEMLANE_ENCRYPTION": "0"}


async def drop_redis(settings: Settings) -> None:
    """Deletes a finished run's Redis keys (its namespace), which `discard` leaves."""
    r = aioredis.from_url(settings.redis_url)
    try:
        batch = []
        async for k in r.scan_iter(f"{settings.redis_root}*", count=10_000):
            batch.append(k)
            if len(batch) >= 10_000:
                await r.delete(*batch)
                batch = []
        if batch:
            await r.delete(*batch)
    finally:
        await r.aclose()


def overhead(on: float, off: float) -> float:
    """Per cent more time with encryption, from rates (or, swapped, from latencies)."""
    return (off / on - 1) * 100


def paired(on: list[float], off: list[float]) -> float:
    """The median of each repeat's overhead: its two runs were next to each other in time, so
    load that comes and goes touches a pair more alike than it touches the two medians."""
    return round(median([overhead(a, b) for a, b in zip(on, off, strict=True)]), 1)


def rounded(xs: list[float]) -> list[float]:
    return [round(x, 2) for x in xs]


async def sealed_share(settings: Settings) -> tuple[int, int]:
    """(record events sealed, record events) on a deployment's event log so far."""
    c = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, isolation_level="read_committed",
                         enable_auto_commit=False, group_id=None)
    await c.start()
    sealed = total = 0
    try:
        tps = [TopicPartition(settings.topic(EVENTS.name), p) for p in range(EVENTS.partitions)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        end = await c.end_offsets(tps)
        while [tp for tp in tps if await c.position(tp) < end[tp]]:
            for msgs in (await c.getmany(timeout_ms=500, max_records=5000)).values():
                for m in msgs:
                    if m.value is None or b'"record":{' not in m.value:
                        continue
                    total += 1
                    sealed += SEALED_MARK in m.value
    finally:
        await c.stop()
    return sealed, total


def check_sealing(name: str, on: tuple[int, int], off: tuple[int, int]) -> dict[str, int]:
    """The sealed side sealed every record event, the plain side none: else the comparison is void."""
    if not on[1] or on[0] != on[1] or off[0] or not off[1]:
        raise RuntimeError(f"{name}: sealed record events {on[0]}/{on[1]} with encryption, {off[0]}/{off[1]} "
                           "without: one side is not what it claims")
    return {"record_events_on": on[1], "record_events_off": off[1]}


# ------------------------------------------------------------------------- extraction


async def extraction(fake: FakeModel) -> None:
    run_id = f"benchenc{uuid.uuid4().hex[:6]}"
    sides = {}
    for side, extra in (("on", {}), ("off", OFF)):
        data = ROOT / ".run" / f"{run_id}{side}"
        stack, settings = extraction_stack(fake.url, f"{run_id}{side}.", data, free_port(), **extra)
        sides[side] = (stack, settings)
    try:
        for side, (stack, _) in sides.items():
            stack.start_all()
            bx.wait_assigned(stack.log_dir / "extraction.log", 1)
            progress(f"extraction stack with encryption {side} is up")
        on_stack, on_settings = sides["on"]
        off_stack, off_settings = sides["off"]
        bursts: dict[str, list[bx.Burst]] = {"on": [], "off": []}
        async with TurnPublisher(on_settings.kafka_bootstrap, on_settings.topic_prefix) as pub_on, \
                TurnPublisher(off_settings.kafka_bootstrap, off_settings.topic_prefix) as pub_off:
            pubs = {"on": pub_on, "off": pub_off}
            for side in ("on", "off"):
                stack, settings = sides[side]
                progress(f"warm-up ({side}): {EXTRACTION_WARMUP} turns, not measured")
                await bx.drained(stack.api_url, await bx.burst(stack, settings, pubs[side], EXTRACTION_WARMUP))
            for i in range(EXTRACTION_REPEATS):
                # The first side alternates too: neither always follows the other's drain.
                for side in (("on", "off") if i % 2 == 0 else ("off", "on")):
                    stack, settings = sides[side]
                    b = await bx.burst(stack, settings, pubs[side], EXTRACTION_TURNS)
                    await bx.drained(stack.api_url, b)
                    bursts[side].append(b)
                    progress(f"extraction {side}: {b.rate:.0f} turns/s")
            sealing = check_sealing("extraction", await sealed_share(on_settings), await sealed_share(off_settings))
            rates = {s: [b.rate for b in bs] for s, bs in bursts.items()}
            cpu = {s: [b.cpu_ms["extraction"] for b in bs] for s, bs in bursts.items()}
            figure("encryption_overhead_pct", overhead(median(rates["on"]), median(rates["off"])), "%",
                   EXTRACTION_TURNS, on="extraction", turns_per_s_on=round(median(rates["on"]), 1),
                   turns_per_s_off=round(median(rates["off"]), 1), runs_on=rounded(rates["on"]),
                   runs_off=rounded(rates["off"]), paired_pct=paired(rates["on"], rates["off"]),
                   worker_cpu_ms_per_turn_on=round(median(cpu["on"]), 3),
                   worker_cpu_ms_per_turn_off=round(median(cpu["off"]), 3), **sealing)
            off_stack.stop()  # idle, it would only share the cores with the erasures
            await erasures(on_stack, on_settings, pub_on)
    finally:
        for stack, _ in sides.values():
            stack.stop()
    for _, settings in sides.values():
        await drop_redis(settings)
        discard(settings)


# ------------------------------------------------------------------------- erasure

ERASE_CONFIG = AgentConfig.model_validate({"memory": {"scope": {"read": ["user"], "write": ["user"]}},
                                           "history": {"index": "messages"}})


async def subject_keys(settings: Settings, subject: str) -> list[bytes]:
    """The keys-topic keys of `subject`'s data keys a fresh keyring loads now (none once destroyed)."""
    keys = await open_keys(settings, keys_at(settings)(), follow=False)
    try:
        return [r.topic_key for r in keys.keyring.kids(subject)]
    finally:
        await keys.stop()


async def tombstoned_at(settings: Settings, topic_keys: list[bytes]) -> float | None:
    """When (epoch s) the last of `topic_keys` was tombstoned on the keys topic; None while one is not."""
    tp = TopicPartition(settings.topic(keys_topic().name), 0)
    c = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False, group_id=None)
    await c.start()
    stamps: dict[bytes, int] = {}
    try:
        c.assign([tp])
        await c.seek_to_beginning(tp)
        end = (await c.end_offsets([tp]))[tp]
        while await c.position(tp) < end:
            for m in (await c.getmany(tp, timeout_ms=500)).get(tp, ()):
                if m.key in topic_keys:
                    if m.value is None:
                        stamps[m.key] = m.timestamp
                    else:
                        stamps.pop(m.key, None)
    finally:
        await c.stop()
    return max(stamps.values()) / 1000 if len(stamps) == len(topic_keys) else None


async def poll(what: str, check, timeout: float = 60, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while not (got := await check()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not hold within {timeout} s")
        await asyncio.sleep(interval)
    return got


async def erasure(stack, settings: Settings, pub) -> tuple[float, float, float]:
    """One member's erasure: (seconds until unreadable everywhere, until no projection serves
    them, until their data keys are tombstoned)."""
    tenant, agent, key = await new_agent(stack.api_url, settings.operator_key, ERASE_CONFIG)
    user = f"m{uuid.uuid4().hex[:6]}"
    # In this member's facts and message only. Letters only: with the message's 4711, a run of
    # digits can pass for a card number, which the write filter refuses.
    word = "zq" + uuid.uuid4().hex[:10].translate(str.maketrans("0123456789", "ghijklmnop"))
    subject = subject_of(tenant, agent, user)
    # History search sees one session: the turn's.
    async with MemlaneClient(stack.api_url, key, user=user, session="s-api") as c, \
            MemlaneClient(stack.api_url, key, user=user, session="s-hist") as hc, \
            MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
        for k in range(ERASE_FACTS):
            added = await c.add_memory(f"{word} fact {k}: prefers seat {k} on the train")
            if added.get("status") != "applied":
                raise RuntimeError(f"a fact was not applied: {added}")
        await pub.publish(turn(tenant, agent, "s-hist", 1, f"My locker code is {word} 4711", "Noted.", user=user))

        async def all_served():
            listed = (await c.list_memory(first=50))["records"]
            hist = (await hc.search_history(word, mode="lexical"))["events"]
            return len(listed) == ERASE_FACTS + 1 and bool(hist)

        await poll("the member's facts and history message", all_served, timeout=60, interval=0.2)
        if not (await c.search_memory(word, mode="lexical"))[0] or not (await c.recall("c0", f"my {word}?"))["workspaceEntries"]:
            raise RuntimeError("the member's facts are listed but not found by search or recall")
        kids = await subject_keys(settings, subject)
        if not kids:
            raise RuntimeError(f"no data key of {subject} on the keys topic: nothing of the member was sealed")

        t0, wall0 = time.perf_counter(), time.time()
        erased = await op.erase_subject(user)
        if erased.get("erased") != ERASE_FACTS + 1:
            raise RuntimeError(f"DELETE /v1/subjects/{user} answered {erased}, not {ERASE_FACTS + 1} facts erased")

        async def nothing_served():
            if (await c.list_memory(first=50))["records"] or (await c.search_memory(word, mode="lexical"))[0]:
                return False
            if (await c.recall(f"c{uuid.uuid4().hex[:8]}", f"my {word}?"))["workspaceEntries"]:
                return False
            if (await hc.search_history(word, mode="lexical"))["events"]:
                return False
            return not [s for s in (await op.subjects())["subjects"] if s["user"] == user and s["facts"]]

        await poll("no projection serving the erased member", nothing_served)
        projections_s = time.perf_counter() - t0

        async def tombstoned():
            return await tombstoned_at(settings, kids)

        keys_s = await poll("tombstones of the erased member's keys", tombstoned) - wall0
        if await subject_keys(settings, subject):
            raise RuntimeError(f"a fresh keyring still knows {subject} after its keys were tombstoned")
        # Both held at once: the projections are checked again after the keys.
        if not await nothing_served():
            raise RuntimeError("the erased member was served again after their keys were destroyed")
    return max(projections_s, keys_s), projections_s, keys_s


async def erasures(stack, settings: Settings, pub) -> None:
    runs = []
    for i in range(ERASURES):
        runs.append(await erasure(stack, settings, pub))
        progress(f"erasure {i + 1}: unreadable after {runs[-1][0]:.3f} s")
    figure("erasure_to_unreadable_s", median([r[0] for r in runs]), "s", ERASE_FACTS + 1,
           runs=rounded([r[0] for r in runs]), projections_s=round(median([r[1] for r in runs]), 3),
           keys_s=round(median([r[2] for r in runs]), 3),
           note=f"facts per member: {ERASE_FACTS} over HTTP and one extracted from a turn, with its history message")


# ------------------------------------------------------------------------- logs written by this process


def log_items(settings: Settings, n: int, agent_of, codec: Codec = PLAIN):
    """`n` records and their vectors as the ledger and the embedding worker write them:
    sealed when `codec` has a keyring."""
    keyring = codec.cipher
    rng = np.random.default_rng(1)
    for i in range(n):
        agent = agent_of(i)
        text = record_text(i, agent)
        vec = rng.standard_normal(384).astype(np.float32)
        vec /= np.linalg.norm(vec)
        if keyring is None:
            v = VectorComputed.of(MODEL_ID, content_hash(text), vec)
        else:
            subject = subject_of("bench", agent)
            v = VectorComputed.of(MODEL_ID, keyed_hash(text, keyring.current_kid(subject), keyring), vec, subject,
                                  keyring)
        yield settings.topic(VECTORS.name), VECTORS.key_bytes(v), codec.encode(v), vector_partition_of(agent)
        r = MemoryRecord(id=record_id_for("bench", agent, f"c{i}"), version=1, created=T0 + timedelta(seconds=i),
                         modified=T0 + timedelta(seconds=i), tenant="bench", agent=agent, scope="AGENT", kind="fact",
                         summary=text)
        e = RecordAdded(event_id=event_id("bench", agent, f"c{i}", 0), command_id=f"c{i}", tenant="bench",
                        agent=agent, occurred_at=r.created, record=r)
        yield settings.topic(EVENTS.name), EVENTS.key_bytes(e), codec.encode(e)


async def write_log(settings: Settings, n: int, agent_of, agents: list[str], sealed: bool) -> Codec:
    """Writes the log; returns the codec it was written with, whose keyring opens what it
    sealed (`PLAIN` for a plaintext log)."""
    await ensure_topics(settings)
    if not sealed:
        await _produce(settings, log_items(settings, n, agent_of))
        return PLAIN
    codec = keys_at(settings)()
    keys = await open_keys(settings, codec, follow=False)
    try:
        for a in agents:  # published before anything sealed under them, as every writer does
            keys.keyring.current_kid(subject_of("bench", a))
        await keys.flush()
        await _produce(settings, log_items(settings, n, agent_of, codec))
    finally:
        await keys.stop()
    return codec


# ------------------------------------------------------------------------- rebuild


def rebuild_agent(i: int) -> str:
    return f"agent{i % REBUILD_AGENTS}"


def rebuild_once(settings: Settings, codec: Codec) -> tuple[float, float]:
    """One `memlane rebuild` of both projections in a child process, once checked: (seconds,
    CPU seconds of the child and its shard processes, which the machine's other load moves less)."""
    code = f"""
import asyncio, json, resource, sys, time
from settings import Settings
from workers.jobs.rebuild import rebuild_all
from services.bootstrap import index_generations, keys_at
from tests.redis_at import redis_at
def cpu():
    return sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))
s = Settings(topic_prefix={settings.topic_prefix!r}, data_dir={str(settings.data_dir)!r},
             redis_url={settings.redis_url!r}, encryption={settings.encryption!r})
c0, t0 = cpu(), time.perf_counter(); built = asyncio.run(rebuild_all(s, redis_at(s.redis_url), index_generations(s), keys_at(s))); secs, cpu_s = time.perf_counter() - t0, cpu() - c0
print(json.dumps({{"built": built, "secs": secs, "cpu_s": cpu_s}}), flush=True)
sys.stdin.readline()
"""
    env = {**os.environ, **({} if settings.encryption else OFF)}
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err, text=True, cwd=ROOT, env=env)
        msg, released = None, False
        try:
            msg = next((m for line in proc.stdout if line.startswith("{") and "built" in (m := json.loads(line))),
                       None)
            if msg is not None:
                # Counted while the child waits: the next rebuild drops this generation.
                try:
                    check_built(settings, msg["built"], codec)
                except RuntimeError as e:
                    err.seek(0)
                    raise RuntimeError(f"{e}; the rebuild's log ends: {err.read()[-3000:]}") from None
                proc.stdin.write("\n")
                proc.stdin.flush()
                released = True
        finally:
            if proc.poll() is None and not released:
                proc.kill()  # else it would wait on its stdin for good
            proc.wait()
        if proc.returncode or msg is None:
            err.seek(0)
            raise RuntimeError(f"the rebuild process failed ({proc.returncode}): {err.read()[-2000:]}")
    return msg["secs"], msg["cpu_s"]


def check_built(settings: Settings, built: dict[str, int], codec: Codec) -> None:
    """Each generation holds every record of the log, and records read back whole (opened by
    `codec`, the one the log was written with)."""
    counts = {"redis": asyncio.run(rebuild_redis_records(settings, built["redis"], REBUILD_RECORDS, REBUILD_AGENTS,
                                                         codec)),
              "qdrant": qdrant_points(settings, built["qdrant"])}
    if any(n != REBUILD_RECORDS for n in counts.values()):
        raise RuntimeError(f"the rebuild's generations {built} hold {counts} records, not the log's {REBUILD_RECORDS}")


async def rebuild() -> None:
    run_id = f"benchencr{uuid.uuid4().hex[:6]}"
    sides = {side: Settings(topic_prefix=f"{run_id}{side}.", data_dir=ROOT / ".run" / f"{run_id}{side}",
                            redis_url=_bench_redis_url(), encryption=side == "on") for side in ("on", "off")}
    agents = [f"agent{a}" for a in range(REBUILD_AGENTS)]
    codecs = {}
    for side, settings in sides.items():
        t0 = time.perf_counter()
        codecs[side] = await write_log(settings, REBUILD_RECORDS, rebuild_agent, agents, side == "on")
        progress(f"rebuild log ({side}): {REBUILD_RECORDS} records and vectors in {time.perf_counter() - t0:.1f} s")
    sealing = check_sealing("rebuild", await sealed_share(sides["on"]), await sealed_share(sides["off"]))
    for side in ("on", "off"):  # the first rebuild of a log ran at a fraction of the later ones' rate
        warm_s, _ = await asyncio.to_thread(rebuild_once, sides[side], codecs[side])
        progress(f"rebuild warm-up ({side}): {REBUILD_RECORDS / warm_s:.0f} records/s, not measured")
    secs: dict[str, list[float]] = {"on": [], "off": []}
    cpu: dict[str, list[float]] = {"on": [], "off": []}
    for i in range(REBUILD_RUNS):
        for side in (("on", "off") if i % 2 == 0 else ("off", "on")):
            wall, cpu_s = await asyncio.to_thread(rebuild_once, sides[side], codecs[side])
            secs[side].append(wall)
            cpu[side].append(cpu_s / REBUILD_RECORDS * 1e6)
            progress(f"rebuild {side}: {REBUILD_RECORDS / wall:.0f} records/s, {cpu[side][-1]:.0f} CPU us/record")
    rates = {s: [REBUILD_RECORDS / x for x in xs] for s, xs in secs.items()}
    figure("encryption_overhead_pct", overhead(median(rates["on"]), median(rates["off"])), "%", REBUILD_RECORDS,
           on="rebuild", records_per_s_on=round(median(rates["on"])), records_per_s_off=round(median(rates["off"])),
           runs_on=[round(r) for r in rates["on"]], runs_off=[round(r) for r in rates["off"]],
           paired_pct=paired(rates["on"], rates["off"]), cpu_us_per_record_on=round(median(cpu["on"])), cpu_us_per_record_off=round(median(cpu["off"])),
           agents=REBUILD_AGENTS, **sealing)
    for settings in sides.values():
        await drop_redis(settings)
        discard(settings)


# ------------------------------------------------------------------------- recall


async def wait_loaded(stack, settings: Settings, timeout: float = 300) -> None:
    """Until Qdrant holds every point and Redis lists every record of the agent."""
    store = RedisRecords(redis_at(settings.redis_url)(pooled=True), namespace=settings.topic_prefix)
    deadline = time.monotonic() + timeout
    try:
        async with httpx.AsyncClient(base_url=stack.api_url, timeout=30) as h:
            while True:
                points = (await h.get("/health")).json()["projection"]["points"]
                listed = await store.r.zcard(store._keys(await store.generation(), "bench", "big")[1])
                if points >= RECALL_RECORDS and listed >= RECALL_RECORDS:
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{points} points and {listed} listed records of {RECALL_RECORDS} after "
                                       f"{timeout} s ({stack.log_dir})")
                await asyncio.sleep(0.5)
    finally:
        await store.aclose()


WORDS = "invoice shipping refund parcel customer account password billing order delivery".split()


async def one_recall(h: httpx.AsyncClient, q: int, tag: str) -> float:
    """One recall's latency (ms), its text distinct (no embedding cache hit), once checked:
    it found records, opened (their text as written)."""
    text = f"what about the {WORDS[q % 10]} option {q % 97} of request {q} {tag}?"
    t = time.perf_counter()
    r = await h.post("/v1/recall", json={"conversation": f"c{q}-{tag}", "text": text})
    ms = (time.perf_counter() - t) * 1000
    r.raise_for_status()
    records = r.json()["workspaceEntries"]
    if not records or not all(x["summary"].startswith("Record ") for x in records):
        raise RuntimeError(f"a recall found nothing, or records not as written: {records[:1]}")
    return ms


async def recall() -> None:
    with bench_stack(f"encrecon{uuid.uuid4().hex[:4]}", workers=("ledger", "redis-projection")) as (son, on), \
            bench_stack(f"encrecoff{uuid.uuid4().hex[:4]}", workers=("ledger", "redis-projection"),
                        env=OFF) as (soff, off):
        off = off.model_copy(update={"encryption": False})
        sides = {"on": (son, on), "off": (soff, off)}
        keys, load_s = {}, {}
        for side, (stack, settings) in sides.items():
            async with MemlaneClient(stack.api_url, settings.operator_key, tenant="bench", agent="big") as op:
                keys[side] = await op.issue_key("bench", "big")
                await op.configure({"memory": {"scope": {"read": ["agent"], "write": ["agent"]}},
                                    "has_sessions": False})
            t0 = time.perf_counter()
            await write_log(settings, RECALL_RECORDS, lambda i: "big", ["big"], side == "on")
            await wait_loaded(stack, settings)
            load_s[side] = time.perf_counter() - t0
            progress(f"recall deployment ({side}): {RECALL_RECORDS} records written and loaded in {load_s[side]:.1f} s")
        sealing = check_sealing("recall", await sealed_share(on), await sealed_share(off))
        run = uuid.uuid4().hex[:8]
        lat: dict[str, list[float]] = {"on": [], "off": []}
        clients = {side: httpx.AsyncClient(base_url=stack.api_url, headers={"Authorization": f"Bearer {keys[side]}"},
                                           timeout=30) for side, (stack, _) in sides.items()}
        try:
            cpu0: dict[str, float] = {}
            for q in range(RECALL_WARMUP + RECALL_QUERIES):
                if q == RECALL_WARMUP:
                    cpu0 = {side: bx.cpu_s(stack.procs["api"].pid) for side, (stack, _) in sides.items()}
                # Query by query, the first side alternating: drift reaches both alike.
                for side in (("on", "off") if q % 2 == 0 else ("off", "on")):
                    ms = await one_recall(clients[side], q, run)
                    if q >= RECALL_WARMUP:
                        lat[side].append(ms)
            cpu = {side: (bx.cpu_s(stack.procs["api"].pid) - cpu0[side]) / RECALL_QUERIES * 1000
                   for side, (stack, _) in sides.items()}
        finally:
            for c in clients.values():
                await c.aclose()
        p50 = {s: percentile(xs, 50) for s, xs in lat.items()}
        p95 = {s: percentile(xs, 95) for s, xs in lat.items()}
        figure("encryption_overhead_pct", overhead(p50["off"], p50["on"]), "%", RECALL_RECORDS, on="recall",
               p50_ms_on=round(p50["on"], 2), p50_ms_off=round(p50["off"], 2), p95_ms_on=round(p95["on"], 2),
               p95_ms_off=round(p95["off"], 2), p95_overhead_pct=round(overhead(p95["off"], p95["on"]), 1),
               api_cpu_ms_per_recall_on=round(cpu["on"], 2), api_cpu_ms_per_recall_off=round(cpu["off"], 2),
               queries=RECALL_QUERIES, load_s_on=round(load_s["on"], 1), load_s_off=round(load_s["off"], 1),
               **sealing)
    for settings in (on, off):
        await drop_redis(settings)


# ------------------------------------------------------------------------- retention

RETENTION_AGENT_RECORDS = 200  # the ledger's live-fact cap per agent
OLD_SHARE, RECENT_SHARE = 0.3, 0.1  # tombstones deleted past the retention period / lately


def retention_state(n: int, now: datetime) -> tuple[LedgerState, set[str]]:
    """A state of `n` records folded as the ledger folds its events; the keys of those due for purging."""
    state, due_keys = LedgerState(), set()
    old_at, recent_at = now - RETENTION - timedelta(days=10), now - timedelta(days=30)
    for i in range(n):
        agent = f"agent{i // RETENTION_AGENT_RECORDS}"
        cid = f"c{i}"
        rid = record_id_for("bench", agent, cid)
        created = old_at - timedelta(days=30, seconds=i)
        r = MemoryRecord(id=rid, version=1, created=created, modified=created, tenant="bench", agent=agent,
                         scope="AGENT", kind="fact", summary=record_text(i, agent))
        evolve(state, RecordAdded(event_id=event_id("bench", agent, cid, 0), command_id=cid, tenant="bench",
                                  agent=agent, occurred_at=created, record=r))
        share = (i % 100) / 100
        if share < OLD_SHARE + RECENT_SHARE:
            at = old_at if share < OLD_SHARE else recent_at
            gone = r.model_copy(update={"version": 2, "status": Status.DELETED, "modified": at})
            evolve(state, RecordDeleted(event_id=event_id("bench", agent, cid, 1), command_id=f"d{i}",
                                        tenant="bench", agent=agent, occurred_at=at, record=gone))
            if share < OLD_SHARE:
                due_keys.add(f"bench/{agent}/{rid}")
    return state, due_keys


def retention_night(state: LedgerState, now: datetime) -> tuple[float, int, int]:
    """(seconds, records purged by the night's events, commands)."""
    t0 = time.perf_counter()
    night = due(state, now)
    purged = 0
    for cmd in night.commands:
        for e in decide(state, cmd):
            evolve(state, e)
            if e.type == "RecordsPurged":
                purged += len(e.record_ids)
    return time.perf_counter() - t0, purged, len(night.commands)


def copied(state: LedgerState) -> LedgerState:
    """A copy a night can change: the rules replace the values they change, never mutate them."""
    return LedgerState(**{f.name: (dict(v) if isinstance(v := getattr(state, f.name), dict) else v)
                          for f in dataclasses.fields(state)})


def retention() -> None:
    now = T0 + timedelta(days=400)
    t0 = time.perf_counter()
    base, due_keys = retention_state(RETENTION_RECORDS, now)  # folded once: 9 s at 100,000
    progress(f"retention: a state of {RETENTION_RECORDS} records folded in {time.perf_counter() - t0:.1f} s")
    runs, commands = [], 0
    for _ in range(RETENTION_RUNS):
        state = copied(base)
        secs, purged, commands = retention_night(state, now)
        before, left = set(base.records), set(state.records)
        if purged != len(due_keys) or before - left != due_keys or left - before or len(base.records) != RETENTION_RECORDS:
            raise RuntimeError(f"the night purged {purged} records ({len(before - left)} left the state), not the "
                               f"{len(due_keys)} tombstones past the retention period")
        runs.append(RETENTION_RECORDS / secs)
    figure("retention_sweep_records_per_s", median(runs), "records/s", RETENTION_RECORDS, runs=[round(r) for r in runs],
           purged=len(due_keys), commands=commands, agents=RETENTION_RECORDS // RETENTION_AGENT_RECORDS,
           note="pure: due() and deciding and folding its commands over a LedgerState (no broker)")


# ------------------------------------------------------------------------- the group


async def run() -> None:
    t0 = time.monotonic()
    progress(f"encryption: scale {SCALE}")
    fake = FakeModel().start()
    fake.default = bx.echo
    try:
        await extraction(fake)
    finally:
        fake.stop()
    progress(f"extraction and erasure done at {time.monotonic() - t0:.0f} s")
    await rebuild()
    progress(f"rebuild done at {time.monotonic() - t0:.0f} s")
    await recall()
    progress(f"recall done at {time.monotonic() - t0:.0f} s")
    retention()
    progress(f"encryption group done in {time.monotonic() - t0:.0f} s")
