"""consolidation: ended sessions consolidated per second, around an instant fake model.

`consolidation_runs_per_s`: `RUNS` sessions over `AGENTS` agents, each with one turn the
history worker has folded before the clock starts; then every session's `SessionEnded` is
published at once. The window runs from just before that to the Kafka timestamp of the last
episode command the consolidation worker sent. Each run's answer has an episode and two
facts: one of its own and a decision every run of the agent restates, so the ledger also
counts confirmations and promotes one procedure per agent. The figure is printed only once
the API shows the work done: every agent's episodes, facts, confirmations and procedure.
Median of `REPEATS` bursts after a warm-up burst; reviews are off (a cadence of 100 messages),
so only consolidation asks the model.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import UTC, datetime

from aiokafka import AIOKafkaConsumer

from events.config import AgentConfig, EveryMessages, ExtractionConfig, MemoryConfig, ScopeConfig
from events.topics import COMMANDS
from events.turns import SessionEnded
from services.client import MemlaneClient, TurnPublisher
from settings import ROOT
from tests.bench.common import discard, figure, median, progress
from tests.e2e.extraction_support import extraction_stack, new_agent, turn
from tests.fakes.model_server import FakeModel, Reply

AGENTS = 10
SESSIONS_PER_AGENT = 30  # 30 episodes and 31 live facts per agent a burst, under the live-fact cap
RUNS = AGENTS * SESSIONS_PER_AGENT
WARMUP_SESSIONS = 5
REPEATS = 3
DECISION = "Deploys go out on Tuesdays after the freeze review"
CONFIG = AgentConfig(memory=MemoryConfig(kinds=["fact", "decision"],
                                         scope=ScopeConfig(read=["session", "agent"], write=["session", "agent"]),
                                         extraction=ExtractionConfig(every=EveryMessages(messages=100))))


def answer(body: dict) -> Reply:
    """An episode and two facts for a consolidation (its own fact names its session's marker)."""
    text = body["messages"][-1]["content"]
    run = text.split("run-", 1)[1].split(":", 1)[0] if "run-" in text else uuid.uuid4().hex[:8]
    return Reply({"goal": "Ship the release", "outcome": "successful", "success_score": 0.9,
                  "summary": f"Shipped release {run}", "procedure": None, "anti_pattern": None,
                  "facts": [{"summary": f"Release {run} went out from branch rel-{run}", "content": "",
                             "kind": "fact", "confidence": 0.9},
                            {"summary": DECISION, "content": "", "kind": "decision", "confidence": 0.9}]})


async def episode_stamps(settings, agents: set[str], n: int, since_ms: int) -> list[int]:
    """Kafka timestamps (ms) of `n` episode commands of `agents` sent after `since_ms`. Matched
    on their bytes: `kind` and `agent` are never sealed, and decoding would cost this process
    the cores the pipeline measured runs on."""
    c = AIOKafkaConsumer(settings.topic(COMMANDS.name), bootstrap_servers=settings.kafka_bootstrap,
                         isolation_level="read_committed", auto_offset_reset="earliest", group_id=None)
    await c.start()
    marks = {json.dumps({"agent": a})[1:-1].replace(" ", "").encode() for a in agents}
    stamps: list[int] = []
    deadline = time.monotonic() + 300
    try:
        while len(stamps) < n and time.monotonic() < deadline:
            for msgs in (await c.getmany(timeout_ms=500)).values():
                for m in msgs:
                    if (m.timestamp >= since_ms and b'"kind":"episode"' in m.value
                            and any(mark in m.value for mark in marks)):
                        stamps.append(m.timestamp)
            progress(f"{len(stamps)}/{n} sessions consolidated")
    finally:
        await c.stop()
    if len(stamps) < n:
        raise RuntimeError(f"only {len(stamps)} of {n} sessions were consolidated within 300 s")
    return sorted(stamps)


async def history_turns(api_url: str, key: str) -> int:
    async with MemlaneClient(api_url, key) as c:
        return (await c._call("GET", "/v1/history/status"))["turns"]


async def burst(stack, settings, pub, sessions: int) -> float:
    """`sessions` runs per agent on `AGENTS` new agents; their rate, once the API shows the work done."""
    agents = await asyncio.gather(*(new_agent(stack.api_url, settings.operator_key, CONFIG) for _ in range(AGENTS)))
    folded = await history_turns(stack.api_url, settings.operator_key)
    turns, ends = [], []
    for tenant, agent, _ in agents:
        for s in range(sessions):
            run = uuid.uuid4().hex[:8]
            turns.append(turn(tenant, agent, f"s{s}", 1, f"run-{run}: ship the release", "Shipped."))
            ends.append(SessionEnded(event_id=str(uuid.uuid4()), tenant=tenant, agent=agent, session=f"s{s}",
                                     execution_id=f"exec-{run}", outcome="successful", occurred_at=datetime.now(UTC)))
    await pub.publish_many(turns)
    deadline = time.monotonic() + 120
    while await history_turns(stack.api_url, settings.operator_key) < folded + len(turns):
        if time.monotonic() > deadline:
            raise RuntimeError("the history worker did not fold the burst's turns within 120 s")
        await asyncio.sleep(0.1)
    since = time.time()
    await pub.publish_many(ends)
    stamps = await episode_stamps(settings, {a for _, a, _ in agents}, len(ends), int(since * 1000) - 1000)
    rate = len(ends) / max(stamps[-1] / 1000 - since, 1e-3)
    await done(stack, settings, agents, sessions)
    return rate


async def done(stack, settings, agents, sessions: int, timeout: float = 120) -> None:
    """Every agent shows its episodes, its facts, the decision confirmed by every later run
    and the one procedure it became: the work was done, not only its commands sent."""
    deadline = time.monotonic() + timeout
    for tenant, agent, _ in agents:
        async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
            while True:
                o = await op._call("GET", "/v1/agent/overview")
                rows = (await op.list_memory(first=200))["records"]
                decision = [r for r in rows if r["kind"] == "decision"]
                ok = (o["episodes"] == sessions and o["by_kind"].get("fact", 0) == sessions
                      and o["procedures"] == (1 if sessions >= 3 else 0)
                      and [d["confirmations"] for d in decision] == [sessions - 1])
                if ok:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"agent {agent}: the work is not all there: {o['by_kind']}, "
                                       f"{[d['confirmations'] for d in decision]}")
                await asyncio.sleep(0.2)


async def run() -> None:
    fake = FakeModel().start()
    fake.default = answer
    run_id = f"benchc{uuid.uuid4().hex[:6]}"
    stack, settings = extraction_stack(fake.url, f"{run_id}.", ROOT / ".run" / run_id, 38284)
    try:
        stack.start_all()
        async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
            progress(f"warm-up: {AGENTS * WARMUP_SESSIONS} sessions, not measured")
            await burst(stack, settings, pub, WARMUP_SESSIONS)
            rates = []
            for i in range(REPEATS):
                rates.append(await burst(stack, settings, pub, SESSIONS_PER_AGENT))
                progress(f"burst {i + 1}: {rates[-1]:.1f} sessions/s")
        figure("consolidation_runs_per_s", median(rates), "sessions/s", RUNS, runs=[round(r, 1) for r in rates],
               agents=AGENTS, facts_per_run=2, checked="episodes, facts, confirmations, one procedure per agent")
    finally:
        stack.stop()
        fake.stop()
    discard(settings)
