"""scale (history): indexing session history on long messages with 1 and 2 embedding workers.

History parts are embedded by the embedding worker (its history-embedding consumer group, which
scales) and only
indexed by the API's history projection. Each run is a private stack (ledger and Redis
projection for the agent's configuration, N embedding workers in one group, the API) fed
the same deterministic turns: a user and an assistant message of about 1,000 characters each,
as LongMemEval's are, over sessions spread across the turns partitions.
`history_index_turns_per_s_long` is measured from the first turn produced until the history
index holds every turn's parts; `history_index_ratio_2_over_1` compares the two. The turns
topic's partition count caps how many workers share the work; on a machine with fewer free
cores than workers the ratio stays near 1.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import time
import uuid
from datetime import UTC, datetime, timedelta

import httpx

from events import AgentConfig, Message, TurnCommitted
from events.codec import encode
from events.rules.history import kept_events, parts_of
from events.topics import EVENTS, TURNS
from services.client import MemlaneClient, TurnPublisher
from services.stack import Stack, command
from tests.bench.common import bench_stack, figure, progress
from workers.processors.history_embedding import HistoryEmbeddingProcessor

TURN_COUNT = 240
SESSIONS = 24  # 3 in each turns partition, so two workers get equal shares
TENANT, AGENT = "bench", "history-scale"
CHARS = 1000
START = datetime(2026, 9, 1, 9, 0, tzinfo=UTC)
# Everyday English words: about one token each, so a 1,000-character message is about the
# 250 tokens of a real one (random letters would tokenize into several pieces per word).
WORDS = (
    "the of and to in is was for that on with as by at from his her they this are have be not one had were but all "
    "their which when there we an or can would more what about into so if out some up them other these could then "
    "time like than first been people my now made over only did many may way down day use water long little very "
    "after words called just where most know get through back much before go good new write our used me man too any "
    "same right look think also around another came come work three word must because does part even place well such "
    "here take why things help put years different away again off went old number great tell men say small every "
    "found still between name should home big give air line set own under read last never us left end along while "
    "might next sound below saw something thought both few those always looked show large often together asked house "
    "world going want school important until form food keep children feet land side without once life enough took "
    "sometimes four head above kind began almost live page got earth need far hand high year mother light country "
    "father let night picture being study second eyes soon times story since white days ever paper hard near better "
    "best across during today however sure means knew try told young miles sun ways thing whole hear example heard "
    "several change answer room sea against top turned learn point city play toward five using himself usually"
).split()


def long_message(rng: random.Random) -> str:
    words: list[str] = []
    n = 0
    while n < CHARS:
        w = rng.choice(WORDS)
        words.append(w)
        n += len(w) + 1
    return " ".join(words)[:CHARS]


def balanced_sessions(tenant: str, agent: str) -> list[str]:
    """Session names whose turns fall evenly on the turns partitions (Kafka's partitioner on
    the session key), so the workers' shares differ only by how the group assigns partitions."""
    per, names, i = SESSIONS // TURNS.partitions, [], 0
    taken = [0] * TURNS.partitions
    while len(names) < SESSIONS:
        name, i = f"s{i}", i + 1
        p = TURNS.partition_of(f"{tenant}/{agent}/{name}".encode())
        if taken[p] < per:
            taken[p] += 1
            names.append(name)
    return names


def bench_turns(tenant: str, agent: str) -> list[TurnCommitted]:
    rng = random.Random(24)
    sessions = balanced_sessions(tenant, agent)
    turns = []
    for i in range(TURN_COUNT):
        session, n = sessions[i % SESSIONS], i // SESSIONS + 1
        turns.append(TurnCommitted(
            event_id=str(uuid.UUID(int=rng.getrandbits(128))), tenant=tenant, agent=agent, session=session, turn=n,
            execution_id=f"{session}-x", occurred_at=START + timedelta(minutes=i),
            messages=[Message(id=f"{session}-{n}-u", role="user", content=long_message(rng)),
                      Message(id=f"{session}-{n}-a", role="assistant", content=long_message(rng))],
        ))
    return turns


def start_replica(stack: Stack, n: int) -> None:
    """One more embedding worker in the same consumer groups, with a log of its own."""
    out = open(stack.log_dir / f"embedding.{n}.log", "ab")
    stack.procs[f"embedding.{n}"] = subprocess.Popen(command("embedding"), env=stack.env, stdout=out,
                                                     stderr=subprocess.STDOUT, start_new_session=True)


def worker_logs(stack: Stack, workers: int) -> list:
    return [stack.log_dir / "embedding.log"] + [stack.log_dir / f"embedding.{n}.log" for n in range(2, workers + 1)]


def assigned(stack: Stack, workers: int) -> bool:
    """Whether the history embedding group's workers share every partition it reads (each
    worker's last assignment in that group, read from its log): runs of 2 start measuring once
    both work."""
    counts = []
    for path in worker_logs(stack, workers):
        last = None
        for line in path.read_text().splitlines() if path.exists() else []:
            if '"partitions_assigned"' in line and json.loads(line)["worker"] == HistoryEmbeddingProcessor.name:
                last = json.loads(line)["partitions"]
        if not last:
            return False
        counts.append(len(last))
    return sum(counts) == TURNS.partitions + EVENTS.partitions


def shares(stack: Stack, workers: int) -> list[int]:
    """History parts each worker sent (its log's `history_vectors_sent`): both did work."""
    return [sum(json.loads(line)["sent"] for line in path.read_text().splitlines() if '"history_vectors_sent"' in line)
            for path in worker_logs(stack, workers)]


def cpu_s(pid: int) -> float:
    """CPU seconds a process has used (user + system), from /proc."""
    fields = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(workers: int) -> float:
    with bench_stack(f"scalehist{workers}w", workers=("ledger", "redis-projection", "embedding")) as (stack, settings):
        for n in range(2, workers + 1):
            start_replica(stack, n)
        deadline = time.monotonic() + 120
        while not assigned(stack, workers):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {workers} embedding workers did not share the partitions in 120 s")
            await asyncio.sleep(0.5)
        tenant, agent = TENANT, AGENT
        async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
            await op.configure(AgentConfig.model_validate({"history": {"index": "messages"}}))
        turns = bench_turns(tenant, agent)
        parts = sum(len(parts_of(e)) for t in turns for e in kept_events(t))
        chars = sum(len(m.content) for t in turns for m in t.messages) / sum(len(t.messages) for t in turns)
        progress(f"{workers} embedding worker(s): publishing {len(turns)} turns, {parts} parts, "
                 f"{chars:.0f} characters a message")
        pids = [p.pid for name, p in stack.procs.items() if name.startswith("embedding")]
        cpu0, load = [cpu_s(p) for p in pids], os.getloadavg()[0]
        async with httpx.AsyncClient(base_url=stack.api_url, timeout=30) as http:
            async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
                t0 = time.perf_counter()
                futs = [await pub.producer.send(pub.topic, encode(t), key=TURNS.key_bytes(t)) for t in turns]
                await asyncio.gather(*futs)
            while True:
                st = (await http.get("/v1/history/status")).json()
                if st["turns"] >= len(turns) and st["points"] >= parts:
                    elapsed = time.perf_counter() - t0
                    break
                if time.perf_counter() - t0 > 900:
                    raise RuntimeError(f"history indexed {st} of {len(turns)} turns ({parts} parts) in 900 s")
                await asyncio.sleep(0.2)
        cpu = [round(cpu_s(p) - c, 1) for p, c in zip(pids, cpu0, strict=True)]
        sent = shares(stack, workers)
        progress(f"{workers} embedding worker(s): {len(turns) / elapsed:.1f} turns/s ({elapsed:.1f} s); parts sent "
                 f"per worker {sent}, CPU s {cpu}; load average {load:.1f} at the start")
        if (st["turns"], st["points"], st["parked"]) != (len(turns), parts, 0):
            raise RuntimeError(f"the history index holds {st}; expected {len(turns)} turns and {parts} parts")
    rate = len(turns) / elapsed
    figure("history_index_turns_per_s_long", rate, "turns/s", len(turns), embedding_workers=workers, parts=parts,
           message_chars=round(chars), parts_per_worker=sent, worker_cpu_s=cpu, load_1m=round(load, 1))
    return rate


async def run() -> None:
    one = await measure(1)
    two = await measure(2)
    figure("history_index_ratio_2_over_1", two / one, "x", TURN_COUNT, turns_per_s_1=round(one, 1),
           turns_per_s_2=round(two, 1))
