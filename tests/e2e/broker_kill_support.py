"""Kill -9 one broker of the local 3-node Kafka cluster during a burst of turns, and count what
was lost or doubled.

Shared by the broker-kill test and `bench_scale_kafka`. The cluster is
`deploy/local/kafka-cluster.sh` (RF 3, min.insync.replicas 2); the memlane stack runs on it
with the same replication. Each turn carries one `add_memory` call with a unique token, so
each must end as exactly one record. After the burst the event log is read back from the
surviving brokers and folded with the pure rules (`MemoryFold`); Redis must equal that fold.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from events import Message, ToolCall
from events.topics import EVENTS, REDELIVERED, TURNS, keys_topic
from projections.records import MemoryFold
from projections.redis.record_view import RedisRecords
from services.bootstrap import keys_at
from services.client import TurnPublisher
from services.stack import Stack, free_port, stack_env
from settings import Settings
from tests.conftest import eventually
from tests.e2e.extraction_support import turn
from tests.redis_at import redis_at
from workers.runtime.data_keys import open_keys
from workers.runtime.topic_reader import TopicReader

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "local" / "kafka-cluster.sh"
# The processes a tool write goes through: turn -> extraction -> ledger -> events -> Redis; the
# API serves the agents' configurations the extraction worker reads.
WORKERS = ("extraction", "ledger", "redis-projection")
# Letters only: a long run of digits can pass for a card number, which the write filter refuses.
_LETTERS = str.maketrans("0123456789", "ghijklmnop")


class Cluster:
    """`deploy/local/kafka-cluster.sh`, driven from Python."""

    def __init__(self, stop_s: int = 20) -> None:
        # A test's cluster holds nothing worth a clean shutdown: its nodes get SIGKILL after stop_s.
        self.env = dict(os.environ, PYTHON=sys.executable, MEMLANE_KAFKA_CLUSTER_STOP_S=str(stop_s))

    def run(self, *args: str, timeout: float = 150) -> str:
        p = subprocess.run([str(SCRIPT), *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"kafka-cluster.sh {' '.join(args)} failed ({p.returncode}): {p.stderr[-2000:]}")
        return p.stdout.strip()

    def start(self) -> str:
        """Starts the cluster (every node) and answers its bootstrap servers."""
        self.run("start")
        return self.run("bootstrap")

    def stop(self) -> None:
        self.run("stop", timeout=60)

    def clean(self) -> None:
        """Stops the cluster and deletes its data. A topic deleted while a node was down stays on
        that node's disk as a stray log Kafka never removes: a test run leaves a fresh cluster."""
        self.run("clean", timeout=60)

    def kill(self, node: int) -> None:
        self.run("kill", str(node), timeout=30)

    def leader(self) -> int:
        """The active controller's node id."""
        return int(self.run("leader", timeout=30))


def cluster_stack(bootstrap: str, prefix: str, data_dir: Path, infra: dict[str, str]) -> Stack:
    env = stack_env(**{
        **infra,
        "MEMLANE_KAFKA_BOOTSTRAP": bootstrap,
        "MEMLANE_TOPIC_PREFIX": prefix,
        "MEMLANE_DATA_DIR": str(data_dir),
        "MEMLANE_API_PORT": str(free_port()),
        "MEMLANE_TOPIC_REPLICATION_FACTOR": "3",
        "MEMLANE_TOPIC_MIN_INSYNC_REPLICAS": "2",
    })
    return Stack(env, data_dir / "logs")


@dataclass
class KillResult:
    victim: int
    controller: bool  # the victim was the active controller
    turns: int
    acked: int = 0
    events_at_kill: int = 0  # committed records of the event log when the broker died
    victim_led: list[int] = field(default_factory=list)  # event partitions the victim led
    lost: list[str] = field(default_factory=list)  # acknowledged turns with no record
    duplicated: list[str] = field(default_factory=list)  # turns with more than one record
    doubled_events: list[str] = field(default_factory=list)  # event ids logged twice, unmarked
    redelivered: int = 0  # marked copies in the event log (0: a redelivery's answer goes to the replies topic)
    view_differs: list[str] = field(default_factory=list)  # where Redis and the fold disagree
    burst_s: float = 0.0  # first turn published to every record in Redis
    pause_s: float = 0.0  # the longest the event log went without a new event (the failover)
    records: int = 0  # turns whose record Redis lists (counted)
    logged: int = 0  # turns whose RecordAdded the log holds (counted)
    seconds: float = 0.0


async def replication(bootstrap: str, topics: list[str]) -> dict[str, tuple[set[int], str | None]]:
    """Each topic's replica counts (over its partitions) and its min.insync.replicas."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(topics)
        configs = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t) for t in topics])
    finally:
        await admin.close()
    isr: dict[str, str | None] = {}
    for resp in configs:
        for _, _, _, name, entries in resp.resources:
            isr[name] = next((e[1] for e in entries if e[0] == "min.insync.replicas"), None)
    return {d["topic"]: ({len(p["replicas"]) for p in d["partitions"]}, isr.get(d["topic"])) for d in described}


async def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """partition -> leader node of `topic`."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (d,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    return {p["partition"]: p["leader"] for p in d["partitions"]}


async def read_log(bootstrap: str, topic: str, partitions: int) -> list:
    """Every committed message of `topic` up to its end as of now."""
    async with TopicReader(Settings(kafka_bootstrap=bootstrap)) as r:
        return await r.read_all([TopicPartition(topic, p) for p in range(partitions)])


async def committed(bootstrap: str, topic: str, partitions: int) -> int:
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, isolation_level="read_committed")
    await c.start()
    try:
        return sum((await c.end_offsets([TopicPartition(topic, p) for p in range(partitions)])).values())
    finally:
        await c.stop()


def _agents(n: int) -> list[tuple[str, str]]:
    """New agents, unconfigured: the default configuration lets an agent's add_memory calls in."""
    return [(f"bk{uuid.uuid4().hex[:6]}", f"agent{uuid.uuid4().hex[:6]}") for _ in range(n)]


def _turns(agents: list[tuple[str, str]], tokens: list[str]) -> list:
    out = []
    for i, tok in enumerate(tokens):
        tenant, agent = agents[i % len(agents)]
        call = ToolCall(id=f"call-{tok}", name="add_memory", arguments={"summary": f"broker kill record {tok}"})
        out.append(turn(tenant, agent, f"s{tok[:10]}", 1, messages=[
            Message(id=f"{tok}-u", role="user", content=f"please remember {tok}"),
            Message(id=f"{tok}-a", role="assistant", content="noted", tool_calls=[call]),
        ]))
    return out


def _token(summary: str) -> str:
    return summary.rsplit(" ", 1)[-1]


async def listing(view, tenant: str, agent: str) -> list:
    """The agent's whole listing (Redis or the fold), newest first."""
    return (await view.page(tenant, agent, 100_000)).records


async def broker_kill_round(cluster: Cluster, bootstrap: str, stack: Stack, redis_url: str, turns: int = 80,
                            agents: int = 4, settle_s: float = 60.0, progress=None) -> KillResult:
    """Publishes `turns` turns, half before and half after kill -9 of the active controller
    (a leader of event partitions as well), then compares the log, its fold and Redis."""
    t0 = time.monotonic()
    prefix = stack.env["MEMLANE_TOPIC_PREFIX"]
    events_topic = prefix + EVENTS.name
    who = _agents(agents)
    tokens = [uuid.uuid4().hex.translate(_LETTERS) for _ in range(turns)]
    batch = _turns(who, tokens)
    half = turns // 2

    controller = victim = cluster.leader()
    led = await leaders(bootstrap, events_topic)
    if victim not in led.values():
        victim = led[0]  # the controller leads no event partition: take a partition's leader instead
    res = KillResult(victim=victim, controller=victim == controller, turns=turns,
                     victim_led=sorted(p for p, n in led.items() if n == victim))
    # Records and events are sealed under the agents' keys, which the ledger makes as it goes
    # (and publishes before anything sealed under them): each read below catches up first.
    s = Settings(topic_prefix=prefix, kafka_bootstrap=bootstrap)
    opening = keys_at(s)()
    redis = RedisRecords(redis_at(redis_url)(pooled=True), namespace=prefix, codec=opening)
    keys = await open_keys(s, opening, follow=False)

    async def caught_up() -> None:
        if keys is not None:  # None: encryption is off
            await keys.catch_up()

    try:
        burst0 = time.monotonic()
        async with TurnPublisher(bootstrap, prefix) as publisher:
            await publisher.publish_many(batch[:half])
            res.acked = half

            # Mid-stream: the ledger has committed some of the first half's events, not all.
            async def flowing():
                n = await committed(bootstrap, events_topic, EVENTS.partitions)
                return n if n >= max(4, half // 4) else None

            res.events_at_kill = await eventually(flowing, timeout=60, interval=0.05)
            cluster.kill(victim)
            if progress:
                role = "the controller, " if res.controller else ""
                progress(f"kill -9 node {victim} ({role}leader of event partitions {res.victim_led}) "
                         f"at {res.events_at_kill} committed event offsets")
            await publisher.publish_many(batch[half:])
            res.acked = turns

        async def listed():
            """token -> how many records of the agent's Redis listing carry it, once all are there."""
            seen: Counter[str] = Counter()
            await caught_up()
            for tenant, agent in who:
                seen.update(_token(r.summary) for r in await listing(redis, tenant, agent))
            return seen if all(seen[t] for t in tokens) else None

        try:
            seen = await eventually(listed, timeout=settle_s, interval=0.2)
        except AssertionError:
            seen = Counter()
            await caught_up()
            for tenant, agent in who:
                seen.update(_token(r.summary) for r in await listing(redis, tenant, agent))
        res.burst_s = time.monotonic() - burst0
        res.lost = [t for t in tokens if not seen[t]]
        res.records = sum(1 for t in tokens if seen[t])
        res.duplicated = [t for t in tokens if seen[t] > 1]

        # The log as the surviving brokers hold it.
        msgs = await read_log(bootstrap, events_topic, EVENTS.partitions)
        await caught_up()
        # The ledger answers a redelivered command on the replies topic; a marked copy here would
        # come from an older ledger, and projections skip it. An unmarked event id seen twice
        # would be applied twice.
        unmarked = [m for m in msgs if (REDELIVERED, b"1") not in (m.headers or ())]
        events = [opening.decode(EVENTS.name, m.value) for m in unmarked]
        res.redelivered = len(msgs) - len(unmarked)
        stamps = sorted(m.timestamp / 1000 for m in msgs)
        res.pause_s = max((b - a for a, b in zip(stamps, stamps[1:])), default=0.0)
        ids = Counter(e.event_id for e in events)
        res.doubled_events = [i for i, n in ids.items() if n > 1]
        added = Counter(_token(e.record.summary) for e in events if e.type == "RecordAdded")
        res.logged = sum(1 for t in tokens if added[t])
        res.lost += [t for t in tokens if not added[t] and t not in res.lost]
        res.duplicated += [t for t in tokens if added[t] > 1 and t not in res.duplicated]

        fold = MemoryFold()
        await fold.apply(events)
        for tenant, agent in who:
            want = await listing(fold, tenant, agent)
            got = await listing(redis, tenant, agent)
            if got != want:
                res.view_differs.append(f"{tenant}/{agent}: listing of {len(got)} records, fold {len(want)}")
        for (tenant, agent, rid), v in fold.current.items():
            r = await redis.get(tenant, agent, rid)
            if r is None or r != fold.versions[(tenant, agent, rid)][v]:
                res.view_differs.append(f"{tenant}/{agent}/{rid} v{v}: Redis has {r.version if r else None}")
    finally:
        await redis.aclose()
        if keys is not None:
            await keys.stop()
    res.seconds = time.monotonic() - t0
    return res


REPLICATED = (EVENTS.name, TURNS.name, EVENTS.dlq, keys_topic().name)
