"""ops: how long operations events take to heal.

- `rebalance_takeover_s`: two extraction workers share `memlane.turns` in one consumer group;
  one is killed (SIGKILL) and a turn keyed to one of its partitions is published at once. The
  figure runs from the kill to the Kafka timestamp of that turn's fact on the event log (the
  survivor reviewed it and the ledger applied it); `outcome_s` to its `TurnResolved`. The dead
  worker leaves the group only when the broker misses its heartbeats for the consumer's
  `session_timeout_ms` (`workers/runtime/kafka_io.py`), which the figure mostly is. Median of 3, the
  killed worker started again (and the group shared again) between runs.
- `ledger_ready_s_1m_events`: a ledger started on an event log of MEMLANE_BENCH_OPS_EVENTS
  events (default 1,000,000 RecordAdded, 200 per agent, as `bench_rebuild` writes them),
  from the process's start to the event of the last of 8 commands (one per partition) sent
  right after it started: the ledger decides once it has folded every partition it was
  assigned. Without its snapshot (the files deleted: a new machine), then with the snapshot
  that run wrote (`ledger_ready_s_snapshot_...`; a log under the ledger's 100,000 events per
  partition gets none, and the bench writes one as a recovery would). `ready_endpoint_s`: when
  the process's own `GET /ready` (MEMLANE_METRICS_PORT) first answered 200. The log is kept
  under `.run/benchopsledger<N>` and the `benchopsledger<N>.` topics between runs (delete both
  to write it again; a log cut short is completed). The ledger runs with MEMLANE_ENCRYPTION=0:
  the log is written in plaintext, as `bench_rebuild`'s is; with sealing on the snapshot would
  also seal every record.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from events import AddMemory, RecordAdded, encode
from events.record import MemoryRecord
from events.rules.ledger import event_id, record_id_for
from events.topics import COMMANDS, EVENTS, TURNS
from services.bootstrap import keys_at
from services.client import TurnPublisher
from services.stack import Stack, free_port, stack_env
from settings import ROOT, Settings
from tests.bench.common import bench_stack, figure, median, progress
from tests.conftest import eventually
from tests.e2e.extraction_support import new_agent, turn
from tests.fakes.model_server import FakeModel
from tests.resilience.test_rebalance import (
    answer_with_fact,
    extraction_group,
    fact_of,
    group_assignment,
    two_workers_share,
)
from workers.processors.ledger import snapshot_file as ledger_snapshot
from workers.runtime.data_keys import open_keys
from workers.runtime.kafka_io import consumer, ensure_topics

TAKEOVER_RUNS = 3
EVENTS_N = int(os.environ.get("MEMLANE_BENCH_OPS_EVENTS", "1000000"))
PER_AGENT = 200  # the ledger's live-fact cap: a log the ledger itself could have written
T0 = datetime(2026, 1, 1, tzinfo=UTC)


# ------------------------------------------------------------------------------ takeover


class EventTail:
    """Reads the event log from its end at creation, keeping each event with its Kafka timestamp."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.seen: list[tuple[float, object]] = []
        self.c: AIOKafkaConsumer | None = None

    async def __aenter__(self) -> EventTail:
        # The events are sealed (with encryption on): opened with the deployment's keys, in a
        # codec of the tail's own. What the bench publishes stays plaintext, as a platform's turns are.
        self.codec = keys_at(self.settings)()
        self.keys = await open_keys(self.settings, self.codec, follow=True)
        self.c = AIOKafkaConsumer(bootstrap_servers=self.settings.kafka_bootstrap, group_id=None,
                                  isolation_level="read_committed", fetch_max_wait_ms=50)
        await self.c.start()
        tps = [TopicPartition(self.settings.topic(EVENTS.name), p) for p in range(EVENTS.partitions)]
        self.c.assign(tps)
        await self.c.seek_to_end(*tps)
        for tp in tps:
            await self.c.position(tp)  # resolved now, before what is measured is written
        return self

    async def __aexit__(self, *exc) -> None:
        await self.c.stop()
        if self.keys is not None:
            await self.keys.stop()

    async def poll(self) -> None:
        for ms in (await self.c.getmany(timeout_ms=100, max_records=5000)).values():
            for m in ms:
                try:
                    e = (self.codec.decode(EVENTS.name, m.value) if self.keys is None
                         else await self.keys.opening(self.codec.decode, EVENTS.name, m.value))
                    self.seen.append((m.timestamp / 1000, e))
                except Exception:
                    continue  # sealed or foreign: not the bench's

    async def wait(self, match, timeout: float) -> tuple[float, object]:
        async def found():
            await self.poll()
            return next(((ts, e) for ts, e in self.seen if match(e)), None)

        return await eventually(found, timeout=timeout, interval=0.01)


async def consumer_timeouts(settings: Settings) -> dict[str, int]:
    c = consumer(settings, "x", group="x")  # not started: only its settings are read
    return {"session_timeout_ms": c._session_timeout_ms, "heartbeat_interval_ms": c._heartbeat_interval_ms,
            "max_poll_interval_ms": c._max_poll_interval_ms}


async def _takeover() -> None:
    fake = FakeModel().start()
    try:
        with bench_stack("ops", env={"OPENAI_BASE_URL": fake.url, "OPENAI_API_KEY": "bench-key",
                                     "MEMLANE_EMBEDDINGS": "openai", "MEMLANE_CONFIG_CACHE_S": "0.5"}) as (stack, settings):
            second = Stack(stack.env, stack.log_dir / "second")
            try:
                second.start("extraction")
                await _takeover_runs(stack, second, settings, fake)
            finally:
                second.stop()
    finally:
        fake.stop()


async def _takeover_runs(stack: Stack, second: Stack, settings: Settings, fake: FakeModel) -> None:
    timeouts = await consumer_timeouts(settings)
    tenant, agent, _ = await new_agent(stack.api_url, settings.operator_key)
    logs = (stack.log_dir / "extraction.log", second.log_dir / "extraction.log")
    runs, outcomes, rebalanced = [], [], []
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
        # A turn through both workers first: the pipeline (API, ledger, projections) is warm.
        warm = []
        for i in range(16):
            m = f"mk{uuid.uuid4().hex[:12]}"
            fake.on(m, answer_with_fact(m, f"w{i}-1-0"))
            warm.append((m, turn(tenant, agent, f"w{i}", 1, f"{m}: escalate my ticket", "Escalated.")))
        await pub.publish_many([t for _, t in warm])
        async with EventTail(settings) as tail:
            for m, _ in warm:
                await tail.wait(lambda e, f=fact_of(m): isinstance(e, RecordAdded) and e.record.summary == f, 60)
        for run in range(TAKEOVER_RUNS):
            victim_parts, survivor_parts = await two_workers_share(settings, logs, timeout=120)
            # The victim alternates, so each log's worker is killed in turn.
            victim, survivor = (stack, second) if run % 2 == 0 else (second, stack)
            if run % 2:
                victim_parts, survivor_parts = survivor_parts, victim_parts
            session = next(s for s in (f"r{run}-{i}" for i in range(10_000))
                           if TURNS.partition_of(f"{tenant}/{agent}/{s}".encode()) in victim_parts)
            m = f"mk{uuid.uuid4().hex[:12]}"
            fake.on(m, answer_with_fact(m, f"{session}-1-0"))
            t = turn(tenant, agent, session, 1, f"{m}: escalate my ticket", "Escalated.")
            raw = encode(t)
            async with EventTail(settings) as tail:
                killed_at = time.time()
                victim.kill("extraction", signal.SIGKILL)
                await pub.producer.send_and_wait(pub.topic, raw, key=TURNS.key_bytes(t))
                ref, fact = t.turn_ref, fact_of(m)
                ts_out, _ = await tail.wait(lambda e, ref=ref: type(e).__name__ == "TurnResolved" and e.turn_ref == ref, 180)
                ts_fact, _ = await tail.wait(lambda e, fact=fact: isinstance(e, RecordAdded) and e.record.summary == fact, 60)
            # The work was done once, by the survivor, which holds every partition now.
            state, members = await group_assignment(settings, extraction_group(settings))
            if members != [list(range(TURNS.partitions))]:
                raise RuntimeError(f"after the kill the group is {state} with {members}: not one survivor with all")
            written = [e for _, e in tail.seen if isinstance(e, RecordAdded) and e.record.summary == fact_of(m)]
            if len(written) != 1:
                raise RuntimeError(f"the turn's fact was written {len(written)} times")
            runs.append(round(ts_fact - killed_at, 3))
            outcomes.append(round(ts_out - killed_at, 3))
            progress(f"takeover {run + 1}/{TAKEOVER_RUNS}: partitions {victim_parts} -> the survivor; fact after "
                     f"{runs[-1]} s, outcome after {outcomes[-1]} s")
            t_restart = time.monotonic()
            victim.start("extraction")
            await two_workers_share(settings, logs, timeout=120)
            rebalanced.append(round(time.monotonic() - t_restart, 3))
    figure("rebalance_takeover_s", median(runs), "s", 1, runs=runs, outcome_s=median(outcomes), outcome_runs=outcomes,
           rejoin_s=rebalanced, workers=2, partitions=TURNS.partitions, **timeouts,
           note=f"median of {TAKEOVER_RUNS}: SIGKILL of one of two extraction workers to the Kafka timestamp of the "
                "fact of a turn keyed to one of its partitions, published right after the kill; the group notices "
                "the death after session_timeout_ms; rejoin_s: the killed worker started again until both share")


# ------------------------------------------------------------------------------ ledger readiness


def _ledger_settings() -> Settings:
    prefix = f"benchopsledger{EVENTS_N}."
    return Settings(topic_prefix=prefix, data_dir=ROOT / ".run" / prefix.rstrip("."), encryption=False)


def _events(settings: Settings, n: int, first: int = 0):
    topic = settings.topic(EVENTS.name)
    agents = max(1, EVENTS_N // PER_AGENT)
    for i in range(first, first + n):
        agent = f"agent{i % agents}"
        at = T0 + timedelta(seconds=i)
        r = MemoryRecord(id=record_id_for("bench", agent, f"c{i}"), version=1, created=at, modified=at,
                         tenant="bench", agent=agent, scope="AGENT", kind="fact",
                         summary=f"Record {i} of {agent}: the customer prefers option {i % 97} for shipping")
        e = RecordAdded(event_id=event_id("bench", agent, f"c{i}", 0), command_id=f"c{i}", tenant="bench",
                        agent=agent, occurred_at=at, record=r)
        yield topic, EVENTS.key_bytes(e), encode(e)


async def _log_length(settings: Settings) -> int:
    c = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, group_id=None)
    await c.start()
    try:
        tps = [TopicPartition(settings.topic(EVENTS.name), p) for p in range(EVENTS.partitions)]
        return sum((await c.end_offsets(tps)).values())
    finally:
        await c.stop()


async def _produce_events(settings: Settings, first: int, n: int) -> None:
    """`n` events from index `first`, through an idempotent producer that waits for the broker:
    a broker restart during the write (a failover) loses nothing and doubles nothing."""
    p = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, enable_idempotence=True, acks="all",
                         linger_ms=50, max_batch_size=1 << 20, max_request_size=8 << 20)
    await p.start()
    try:
        for i, (topic, key, value) in enumerate(_events(settings, n, first)):
            await p.send(topic, value, key=key)
            if i % 50_000 == 0:
                progress(f"produced {i} of {n}")
        await p.flush()
    finally:
        await p.stop()


async def _event_log(settings: Settings) -> None:
    await ensure_topics(settings)
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        [d] = await admin.describe_topics([settings.topic(EVENTS.name)])
    finally:
        await admin.close()
    if len(d["partitions"]) != EVENTS.partitions:
        raise RuntimeError(f"{settings.topic(EVENTS.name)} has {len(d['partitions'])} partitions, not "
                           f"{EVENTS.partitions}: delete the {settings.topic_prefix}* topics and run again")
    have = await _log_length(settings)
    if have >= EVENTS_N:
        progress(f"reusing the event log of {have} events under {settings.topic_prefix}")
        return
    # A log cut short (a run stopped while writing it) is completed with events of new records.
    t0 = time.perf_counter()
    await _produce_events(settings, 10 * EVENTS_N + have if have else 0, EVENTS_N - have)
    have = await _log_length(settings)
    if have < EVENTS_N:
        raise RuntimeError(f"the log holds {have} events after writing {EVENTS_N}")
    progress(f"the log holds {have} events ({time.perf_counter() - t0:.1f} s to write)")


def _probe_agents() -> list[str]:
    """An agent of the bench's tenant for each partition of the commands topic."""
    out: dict[int, str] = {}
    i = 0
    while len(out) < COMMANDS.partitions:
        a = f"probe{i}"
        out.setdefault(COMMANDS.partition_of(f"bench/{a}".encode()), a)
        i += 1
    return [out[p] for p in sorted(out)]


def _recovered_lines(log: Path, since: int) -> list[dict]:
    with open(log, "rb") as f:
        f.seek(since)
        lines = f.read().decode(errors="replace").splitlines()
    out = []
    for line in lines:
        if '"ledger_recovered"' in line:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


async def _ledger_ready(settings: Settings, with_snapshot: bool) -> dict:
    paths = [ledger_snapshot.path_for(settings, p) for p in range(EVENTS.partitions)]
    if not with_snapshot:
        for p in paths:
            p.unlink(missing_ok=True)
    elif not all(p.exists() for p in paths):
        raise RuntimeError("no snapshot to start from")
    log = Path(settings.data_dir) / "logs" / "ledger.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    since = log.stat().st_size if log.exists() else 0
    # Its own probe port: the default (docs/reference/metrics.md) is one per kind of process, which another
    # stack's ledger on this machine may hold.
    port = free_port()
    env = stack_env(MEMLANE_TOPIC_PREFIX=settings.topic_prefix, MEMLANE_DATA_DIR=str(settings.data_dir),
                    MEMLANE_ENCRYPTION="0", MEMLANE_METRICS_PORT=str(port))
    probes = [AddMemory(command_id=str(uuid.uuid4()), tenant="bench", agent=a, issued_at=datetime.now(UTC),
                        session="s", summary=f"probe {uuid.uuid4().hex[:8]} of {a}") for a in _probe_agents()]
    ids = {c.command_id for c in probes}
    async with EventTail(settings) as tail:
        started = time.time()
        with open(log, "ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", "services.cli", "worker", "ledger"], env=env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        try:
            # Sent after the start: the ledger can only decide them once it has recovered.
            from tests.e2e.extraction_support import send_commands

            await send_commands(settings, *probes)
            applied: dict[str, float] = {}
            ready: list[float] = []  # when the process's GET /ready first answered 200

            async def all_applied():
                if not ready:
                    try:
                        async with httpx.AsyncClient(timeout=0.5) as h:
                            if (await h.get(f"http://127.0.0.1:{port}/ready")).status_code == 200:
                                ready.append(time.time())
                    except httpx.HTTPError:
                        pass
                await tail.poll()
                applied.update({e.command_id: ts for ts, e in tail.seen if getattr(e, "command_id", None) in ids
                                and isinstance(e, RecordAdded)})
                if proc.poll() is not None:
                    raise RuntimeError(f"the ledger exited with {proc.returncode}; see {log}")
                return len(applied) == len(ids)

            await eventually(all_applied, timeout=1800, interval=0.05)
            if not ready:  # the last command applied: /ready, if the process serves one, says so soon
                async def ready_now():
                    await all_applied()
                    return bool(ready)

                try:
                    await eventually(ready_now, timeout=15, interval=0.05)
                except AssertionError:
                    pass
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    recovered = _recovered_lines(log, since)
    folded = sum(r["events"] for r in recovered)
    from_snapshot = sum(r["from_offset"] > 0 for r in recovered)
    if len(recovered) != EVENTS.partitions:
        raise RuntimeError(f"the ledger recovered {len(recovered)} partitions, not {EVENTS.partitions}")
    if with_snapshot and from_snapshot != EVENTS.partitions:
        raise RuntimeError(f"only {from_snapshot} partitions recovered from their snapshot")
    # The log's offsets also count a transaction marker per ledger commit: a few dozen.
    if not with_snapshot and (from_snapshot or folded < EVENTS_N * 0.999):
        raise RuntimeError(f"without snapshots the ledger folded {folded} events ({from_snapshot} from a snapshot)")
    return {"ready_s": round(max(applied.values()) - started, 3),
            "ready_endpoint_s": round(ready[0] - started, 3) if ready else None, "folded": folded,
            "records": sum(r["records"] for r in recovered)}


async def _snapshots_in_process(settings: Settings) -> None:
    """Snapshots as a recovering ledger writes them, for a log whose partitions hold fewer events
    than a ledger waits for before it writes one (`LedgerProcessor.snapshot_every`)."""
    from settings.logging import configure
    from workers.processors.ledger.processor import LedgerProcessor

    configure("WARNING")
    ledger = LedgerProcessor(settings, codec=keys_at(settings)())
    ledger.snapshot_every = 1
    for p in range(EVENTS.partitions):
        await ledger._recover(p)


async def _ledger_readiness() -> None:
    settings = _ledger_settings()
    await _event_log(settings)
    length = await _log_length(settings)
    cold = await _ledger_ready(settings, with_snapshot=False)
    progress(f"ledger without snapshot: {cold}")
    paths = [ledger_snapshot.path_for(settings, p) for p in range(EVENTS.partitions)]
    made_by_ledger = all(p.exists() for p in paths)
    if not made_by_ledger:
        progress("the ledger wrote no snapshot (under its threshold per partition): writing them as it would")
        await _snapshots_in_process(settings)
    snap_mb = sum(p.stat().st_size for p in paths) / 1e6
    warm = await _ledger_ready(settings, with_snapshot=True)
    progress(f"ledger with snapshot: {warm}")
    name = f"ledger_ready_s_{EVENTS_N // 1_000_000}m_events" if EVENTS_N % 1_000_000 == 0 else f"ledger_ready_s_{EVENTS_N}_events"
    common = dict(log_events=length, partitions=EVENTS.partitions, encryption=False)
    figure(name, cold["ready_s"], "s", EVENTS_N, snapshot=False, folded=cold["folded"], records=cold["records"],
           ready_endpoint_s=cold["ready_endpoint_s"],
           note="process start to the last of 8 commands sent after it applied (one per partition); no snapshot: "
                "every partition folded from the start" + (", and the snapshot written before deciding" if made_by_ledger else ""),
           **common)
    figure(name.replace("ledger_ready_s", "ledger_ready_s_snapshot"), warm["ready_s"], "s", EVENTS_N, snapshot=True,
           folded=warm["folded"], records=warm["records"], snapshot_mb=round(snap_mb, 1),
           ready_endpoint_s=warm["ready_endpoint_s"],
           snapshot_by=("the ledger" if made_by_ledger else "the bench (LedgerProcessor._recover)"), **common)


async def run() -> None:
    await _takeover()
    await _ledger_readiness()
