"""extraction: memlane's own overhead around an instant fake model.

Run twice: with the fake server also serving embeddings, and with the local ONNX embedder
(figures suffixed `_local_embed`), whose own throughput (`embedder_texts_per_s`) is then
the ceiling. Throughput is the run's turns over the time from just before the first turn
is published to the Kafka timestamp of the last forwarded outcome. The worker is already
running and assigned, so its start-up does not count. The window starts at the first turn
and not at the first outcome, because a worker forwards a poll's outcomes together when
the poll's transaction commits. Starting at the first outcome would leave the first
poll's work out of the window while still counting its turns.

Each throughput figure is the median of `REPEATS` bursts of `TURNS` turns (each burst's
rate is in `runs`), after a discarded warm-up burst of `WARMUP_TURNS` turns: the broker's
CPU per turn fell from 1.55 ms in the first run after it started to about 0.45 ms once its
JIT was warm, and the worker's connections and caches start cold too. Each burst starts
once the previous one's last record is searchable, so no burst pays for the background
work (embedding, projections) its predecessor left behind.

`pipeline_cpu_ms_per_turn` is the CPU each process used per turn during the one-worker
bursts (from the first turn published to the last outcome), `by_process`: memlane's
processes, the broker and Redis when `make up` started them, and the bench with its fake
model. Its `cores_busy` is that CPU times the rate: how much of the machine the burst used.
`extraction_worker_cpu_ms_per_turn` is the worker's own part: what a worker costs apart
from what shares the machine's cores with it. 1000 / it is the rate one worker with a core
to itself could sustain.

`extraction_turns_per_s_1_worker_consent` (served run only) is the same workload for agents
that require consent and read and write user scope, each session's member granted: its
bursts alternate with the one-worker bursts, so both figures see the same machine. Each
consent burst is checked before the figure is printed: every turn's fact was written, as
its member's (`GET /v1/subjects` counts them per member), and none was skipped.

`extraction_turns_per_s_1_worker_alone` (served run only) tests that bound: one worker
drains a backlog while the ledger, the embedding worker, the projections and the
consolidation worker are paused (`drain_alone`). The other figures run the whole pipeline on the machine's cores, as a
one-machine deployment would.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from aiokafka import AIOKafkaConsumer

from events.codec import decode
from events.config import AgentConfig, MemoryConfig, ScopeConfig
from events.topics import COMMANDS
from events.turns import TurnCommitted
from projections.embedders.onnx import OnnxMiniLM
from services.client import MemlaneClient, TurnPublisher
from settings import ROOT
from tests.bench.common import discard, figure, median, percentile, progress
from tests.e2e.extraction_support import extraction_stack, new_agent, set_consents, turn
from tests.fakes.model_server import FakeModel, Reply

TURNS = 3000  # several polls of up to 500 turns, so the last poll's tail weighs little
WARMUP_TURNS = 1000
REPEATS = 3
# A burst's turns are spread over agents so that every proposal becomes a record: the ledger
# holds an agent to 200 live records, and with one agent a burst's proposals past the 200th
# were refused, so most turns left the embedding worker and the projections nothing to do.
AGENTS = 25  # 120 turns (and records) per agent in a burst
SESSIONS_PER_AGENT = 2
SESSIONS = AGENTS * SESSIONS_PER_AGENT
LATENCY_TURNS = 20
USER = re.compile(r'role="user">\n(.*?)\n</message>', re.S)
SCOPES = re.compile(r'"scope" is one of:\s*([a-z, ]+)\.')
# The consent figure's agents: a member's facts, kept only with their consent.
CONSENT = AgentConfig(memory=MemoryConfig(consent="required", scope=ScopeConfig(read=["user"], write=["user"])))


def echo(body: dict) -> Reply:
    """Proposes the newest user message as a fact, in the first scope the prompt allows: one record per turn."""
    said = USER.findall(body["messages"][-1]["content"])
    scope = SCOPES.search(body["messages"][0]["content"]).group(1).split(", ")[0]
    return Reply({"candidates": [{"decision": "add", "handle": None, "kind": "fact", "labels": {}, "scope": scope,
                                  "summary": said[-1][:200], "content": "", "source_message_ids": []}]} if said else
                 {"candidates": []})


def fact(i: int) -> str:
    """A turn's user message, and the record the echo model makes of it."""
    return f"Fact {i}: code {uuid.uuid4().hex[:8]} for s{i % SESSIONS}"


async def outcome_stamps(settings, agents: set[str], n: int) -> list[int]:
    """Kafka timestamps (ms), in order, of `n` forwarded outcomes of `agents`."""
    c = AIOKafkaConsumer(settings.topic(COMMANDS.name), bootstrap_servers=settings.kafka_bootstrap,
                         isolation_level="read_committed", auto_offset_reset="earliest", group_id=None)
    await c.start()
    stamps: list[int] = []
    deadline = time.monotonic() + 300
    # Only outcomes are decoded: this process shares the machine's cores with the pipeline,
    # and the proposals it skips are as many as the outcomes.
    mark = b'"TurnOutcome"'
    try:
        while len(stamps) < n and time.monotonic() < deadline:
            for msgs in (await c.getmany(timeout_ms=500)).values():
                for m in msgs:
                    if mark not in m.value:
                        continue
                    cmd = decode(COMMANDS.name, m.value)
                    if cmd.type == "TurnOutcome" and cmd.agent in agents:
                        stamps.append(m.timestamp)
            progress(f"{len(stamps)}/{n} turns forwarded")
    finally:
        await c.stop()
    if len(stamps) < n:
        raise RuntimeError(f"only {len(stamps)} of {n} turns were forwarded within 300 s")
    return sorted(stamps)


@dataclass
class Burst:
    rate: float  # turns per second
    # Per agent: its key, its last turn's session and member, a word only that turn's record has.
    last: list[tuple[str, str, str | None, str]]
    cpu_ms: dict[str, float]  # per process: CPU ms per turn from the first turn published to the last outcome
    agents: list[tuple[str, str, str]]  # (tenant, agent, key)
    n: int  # turns


async def burst_turns(stack, settings, n: int, consent: bool = False
                      ) -> tuple[list[TurnCommitted], list[tuple[str, str, str]], list[tuple[str, str, str | None, str]]]:
    """`n` turns over `AGENTS` new agents; the agents, and per agent its key, its last
    turn's session and member and a word only that turn's record has. With `consent`, the
    agents are configured as `CONSENT`, each session has its member, and every member has
    granted consent before the turns are made."""
    agents = await asyncio.gather(*(new_agent(stack.api_url, settings.operator_key, CONSENT if consent else None)
                                    for _ in range(AGENTS)))
    texts = [fact(i) for i in range(n)]
    if consent:
        # Granted before the turns are made: the ledger refuses a write made before its
        # member's grant, whenever it arrives.
        members = {(t, a, f"u{i % SESSIONS}") for i, (t, a, _) in ((i, agents[i % AGENTS]) for i in range(n))}
        await set_consents(settings, sorted(members))
    turns, last = [], {}
    for i in range(n):
        tenant, agent, key = agents[i % AGENTS]
        session = f"s{i % SESSIONS}"
        user = f"u{i % SESSIONS}" if consent else None
        turns.append(turn(tenant, agent, session, i, texts[i], "Noted.", user=user))
        last[agent] = (key, session, user, texts[i].split()[3])
    return turns, list(agents), list(last.values())


async def burst(stack, settings, pub, n: int = TURNS, consent: bool = False) -> Burst:
    turns, agents, last = await burst_turns(stack, settings, n, consent)
    # Published without waiting for each acknowledgement: one at a time, the publisher
    # itself capped the rate at a few hundred turns per second on a loaded machine.
    pids = pipeline_pids(stack)
    cpu0 = {name: cpu_s(pid) for name, pid in pids.items()}
    since = time.time()
    await pub.publish_many(turns)
    stamps = await outcome_stamps(settings, {a for _, a, _ in agents}, n)
    rate = n / max(stamps[-1] / 1000 - since, 1e-3)
    cpu_ms = {name: (cpu_s(pid) - cpu0[name]) / n * 1000 for name, pid in pids.items()}
    return Burst(rate, last, cpu_ms, agents, n)


# What a worker's outcomes feed, none of which a review waits for, and the consolidation
# worker, which reads the same turns for the session ends among them. The API stays:
# reviews search it.
DOWNSTREAM = ("ledger", "embedding", "redis-projection", "history", "consolidation")


async def drain_alone(stack, settings, pub) -> Burst:
    """One worker draining a backlog of `TURNS` turns while `DOWNSTREAM` is paused (SIGSTOP):
    what one worker process sustains when the work its outcomes cause runs elsewhere, as it
    does where each worker has machines of its own. The worker is
    stopped while the turns are published, and the API's history projection folds them all
    before the worker starts, so neither competes with the drain. The rate is over the
    middle 80% of the outcomes: the first poll's commit and the last poll's tail are left out."""
    turns, agents, last = await burst_turns(stack, settings, TURNS)
    stack.kill("extraction", signal.SIGTERM)
    folded = await history_turns(stack.api_url, settings.operator_key)
    await pub.publish_many(turns)
    deadline = time.monotonic() + 120
    while await history_turns(stack.api_url, settings.operator_key) < folded + TURNS:
        if time.monotonic() > deadline:
            raise RuntimeError("the API's history projection did not fold the backlog within 120 s")
        await asyncio.sleep(0.1)
    # Paused only once the worker has its partitions: a consumer paused longer than its
    # session timeout (10 s) is dropped from its group and recovers when it resumes.
    log = stack.log_dir / "extraction.log"
    assigned = log.read_text().count("partitions_assigned")
    stack.start("extraction")
    await asyncio.to_thread(wait_assigned, log, assigned + 1)
    paused = [stack.procs[name].pid for name in DOWNSTREAM if name in stack.procs]
    for pid in paused:
        os.kill(pid, signal.SIGSTOP)
    try:
        stamps = await outcome_stamps(settings, {a for _, a, _ in agents}, TURNS)
    finally:
        for pid in paused:
            os.kill(pid, signal.SIGCONT)
    lo, hi = TURNS // 10, TURNS - TURNS // 10
    return Burst((hi - lo) / max((stamps[hi - 1] - stamps[lo]) / 1000, 1e-3), last, {}, agents, TURNS)


async def history_turns(api_url: str, key: str) -> int:
    async with httpx.AsyncClient(timeout=10) as http:
        r = await http.get(f"{api_url}/v1/history/status", headers={"Authorization": f"Bearer {key}"})
        r.raise_for_status()
        return r.json()["turns"]


def pipeline_pids(stack) -> dict[str, int]:
    """The stack's processes, the broker and Redis when `make up` started them, and this one."""
    pids = {name: p.pid for name, p in stack.procs.items()}
    for name in ("kafka", "redis"):
        pidfile = ROOT / ".run" / name / f"{name}.pid"
        if pidfile.exists() and Path(f"/proc/{pidfile.read_text().strip()}").exists():
            pids[name] = int(pidfile.read_text())
    pids["bench"] = os.getpid()
    return pids


async def drained(api_url: str, b: Burst, timeout: float = 180) -> None:
    """Waits until each agent's last record of the burst is searchable: an agent's records
    and vectors arrive in order, so the pipeline has then caught up with the burst."""
    deadline = time.monotonic() + timeout
    for key, session, user, code in b.last:
        async with MemlaneClient(api_url, key, session=session, user=user) as c:
            while not (await c.search_memory(code, mode="lexical", limit=1))[0]:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the burst's last records were not searchable within {timeout} s")
                await asyncio.sleep(0.05)


async def measured(stack, settings, pub) -> list[Burst]:
    """`REPEATS` bursts, each started once the one before is drained."""
    out = []
    for _ in range(REPEATS):
        out.append(await burst(stack, settings, pub))
        await drained(stack.api_url, out[-1])
    return out


async def measured_with_consent(stack, settings, pub) -> tuple[list[Burst], list[Burst]]:
    """`REPEATS` bursts of each workload, alternating, each started once the one before is
    drained: the machine's drift over minutes reaches both alike."""
    plain, consent = [], []
    for _ in range(REPEATS):
        plain.append(await burst(stack, settings, pub))
        await drained(stack.api_url, plain[-1])
        consent.append(await burst(stack, settings, pub, consent=True))
        await drained(stack.api_url, consent[-1])
        await members_kept_every_fact(stack.api_url, settings, consent[-1])
    return plain, consent


async def members_kept_every_fact(api_url: str, settings, b: Burst) -> None:
    """Every turn of a consent burst became its member's fact: the per-member counts of the
    burst's agents add up to its turns, and each counted member granted consent."""
    total = 0
    for tenant, agent, _ in b.agents:
        async with MemlaneClient(api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
            subjects = (await op._call("GET", "/v1/subjects"))["subjects"]
        if len(subjects) != SESSIONS_PER_AGENT or any(s["consent"] != "granted" for s in subjects):
            raise RuntimeError(f"agent {agent}: expected {SESSIONS_PER_AGENT} members with consent, got {subjects}")
        total += sum(s["facts"] for s in subjects)
    if total != b.n:
        raise RuntimeError(f"a consent burst of {b.n} turns left {total} member facts: some turns were skipped or refused")


def cpu_s(pid: int) -> float:
    """User and system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def latency(stack, settings, pub) -> list[float]:
    tenant, agent, key = await new_agent(stack.api_url, settings.operator_key)
    lat: list[float] = []
    async with MemlaneClient(stack.api_url, key, session="s1") as c:
        for n in range(LATENCY_TURNS + 3):
            word = f"marker{uuid.uuid4().hex[:10]}"
            t0 = time.perf_counter()
            await pub.publish(turn(tenant, agent, "s1", n, f"The code word is {word}", "ok"))
            while not (await c.search_memory(word, mode="lexical", limit=1))[0]:
                await asyncio.sleep(0.005)
            if n >= 3:
                lat.append((time.perf_counter() - t0) * 1000)
    return lat


def wait_assigned(log: Path, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and log.read_text().count("partitions_assigned") >= count:
            return
        time.sleep(0.2)
    raise RuntimeError(f"extraction workers did not get partitions ({log})")


async def one_run(fake: FakeModel, embeddings: str, suffix: str) -> tuple[float, Any]:
    """Runs the figures of one embedder; returns the one-worker rate and the settings whose
    topics and files the caller discards."""
    run_id = f"benchx{uuid.uuid4().hex[:6]}"
    data = ROOT / ".run" / run_id
    stack, settings = extraction_stack(fake.url, f"{run_id}.", data, 38283, embeddings=embeddings)
    try:
        stack.start_all()
        log = stack.log_dir / "extraction.log"
        wait_assigned(log, 1)
        async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
            lat = await latency(stack, settings, pub)
            figure(f"turn_to_record_ms_p50{suffix}", median(lat), "ms", len(lat))
            figure(f"turn_to_record_ms_p95{suffix}", percentile(lat, 95), "ms", len(lat))
            progress(f"warm-up: {WARMUP_TURNS} turns, not measured")
            await drained(stack.api_url, await burst(stack, settings, pub, WARMUP_TURNS))
            if suffix:
                bursts = await measured(stack, settings, pub)
            else:
                bursts, consented = await measured_with_consent(stack, settings, pub)
            ones = [b.rate for b in bursts]
            one = median(ones)
            figure(f"extraction_turns_per_s_1_worker{suffix}", one, "turns/s", TURNS, runs=rounded(ones))
            if not suffix:
                rates = [b.rate for b in consented]
                consent_ms = [b.cpu_ms["extraction"] for b in consented]
                figure("extraction_turns_per_s_1_worker_consent", median(rates), "turns/s", TURNS, runs=rounded(rates),
                       ratio_to_1_worker=round(median(rates) / one, 3),
                       worker_cpu_ms_per_turn=round(median(consent_ms), 3))
            worker_ms = [b.cpu_ms["extraction"] for b in bursts]
            figure(f"extraction_worker_cpu_ms_per_turn{suffix}", median(worker_ms), "ms", TURNS, runs=rounded(worker_ms),
                   turns_per_worker_cpu_s=round(1000 / median(worker_ms), 1))
            totals = [sum(b.cpu_ms.values()) for b in bursts]
            figure(f"pipeline_cpu_ms_per_turn{suffix}", median(totals), "ms", TURNS, runs=rounded(totals),
                   cores_busy=round(median(totals) * one / 1000, 2),
                   by_process={name: round(median([b.cpu_ms[name] for b in bursts]), 2) for name in bursts[0].cpu_ms})
            # Served run only: a drain's queries are texts the history fold has embedded, so with
            # the local embedder it would measure the same as here.
            if not suffix:
                alone = []
                for _ in range(REPEATS):
                    alone.append(await drain_alone(stack, settings, pub))
                    await drained(stack.api_url, alone[-1])
                rates = [b.rate for b in alone]
                figure("extraction_turns_per_s_1_worker_alone", median(rates), "turns/s", TURNS, runs=rounded(rates),
                       paused=list(DOWNSTREAM), ratio_to_1_worker=round(median(rates) / one, 3))
            assigned = log.read_text().count("partitions_assigned")
            stack.procs["extraction-1"] = stack.procs.pop("extraction")
            stack.start("extraction")
            wait_assigned(log, assigned + 2)  # the first worker's reassignment and the second worker's
            twos = [b.rate for b in await measured(stack, settings, pub)]
            two = median(twos)
            figure(f"extraction_turns_per_s_2_workers{suffix}", two, "turns/s", TURNS, runs=rounded(twos),
                   ratio_to_1_worker=round(two / one, 3))
    finally:
        stack.stop()
    return one, settings


def rounded(xs: list[float]) -> list[float]:
    return [round(x, 2) for x in xs]


CEILING_PASSES, CEILING_TEXTS = 3, 256


def embedder_rates() -> list[float]:
    """Texts per second of one embedder thread (the embedding worker and the API run with
    MEMLANE_EMBED_THREADS=1), on texts like the run's own, in `CEILING_PASSES` passes."""
    emb = OnnxMiniLM(threads=1)
    emb.embed([fact(i) for i in range(8)])
    rates = []
    for _ in range(CEILING_PASSES):
        texts = [fact(i) for i in range(CEILING_TEXTS)]
        t0 = time.perf_counter()
        emb.embed(texts)
        rates.append(CEILING_TEXTS / (time.perf_counter() - t0))
    return rates


async def run() -> None:
    fake = FakeModel().start()
    fake.default = echo
    try:
        progress("run 1: embeddings served by the fake server")
        _, served = await one_run(fake, "openai", "")
        # Measured just before and just after the run it bounds: this machine's speed
        # drifts over minutes, and one side alone moved the share by up to a fifth.
        before = embedder_rates()
        progress("run 2: local ONNX embedder")
        one, local = await one_run(fake, "local", "_local_embed")
        after = embedder_rates()
        # Topics are deleted only now: a deletion keeps the broker busy for a while.
        discard(served)
        discard(local)
        ceiling = median(before + after)
        figure("embedder_texts_per_s", ceiling, "texts/s", 2 * CEILING_PASSES * CEILING_TEXTS,
               before=round(median(before), 1), after=round(median(after), 1),
               one_worker_local_embed_share=round(one / ceiling, 3))
    finally:
        fake.stop()
