"""kill -9 the ledger and the Redis projection mid-stream of 10,000 commands.

After restarts: every command has its events exactly once, the events equal a pure run
of the ledger rules over the commands, and Redis and Qdrant equal the fold of the log.
"""

from __future__ import annotations

import json
import random
import signal
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import httpx
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from events import AddMemory, AgentConfig, ConfigureAgent, DeleteMemory, PinMemory, encode
from events.record import Status
from events.rules.ledger import LedgerState, decide, evolve, record_id_for
from events.topics import COMMANDS, EVENTS
from projections.records import MemoryFold
from projections.redis.record_view import RedisRecords
from services.bootstrap import keys_at
from settings import Settings
from tests.conftest import eventually
from tests.redis_at import redis_at
from workers.runtime.data_keys import open_keys
from workers.runtime.topic_reader import TopicReader

AGENTS = 100
PER_AGENT = 100  # 10,000 commands in all
KILL_AFTER = 1000  # committed offsets of the event log (events and transaction markers) before the kill
T0 = datetime(2026, 5, 1, tzinfo=UTC)


def make_commands(run: str) -> list:
    rnd = random.Random(7)
    cmds = []
    cfg = AgentConfig.model_validate({"memory": {"pinned": {"max_tokens": 400}}})
    for a in range(AGENTS):
        agent = f"agent{a}"
        cmds.append(ConfigureAgent(command_id=f"{run}-cfg-{a}", tenant=f"crash{run}", agent=agent, issued_at=T0, config=cfg))
        added: list[str] = []
        for i in range(PER_AGENT - 1):
            cid = f"{run}-{a}-{i}"
            common = dict(command_id=cid, tenant=f"crash{run}", agent=agent, issued_at=T0 + timedelta(seconds=i))
            roll = rnd.random()
            if roll < 0.6 or not added:
                # Some restate an earlier fact: those merge instead of adding.
                n = rnd.randrange(i + 1) if rnd.random() < 0.1 else i
                cmds.append(AddMemory(**common, summary=f"{agent} fact {n}", session="s"))
                added.append(record_id_for(f"crash{run}", agent, cid))
            elif roll < 0.75:
                cmds.append(AddMemory(**common, summary=f"{agent} correction {i}", session="s",
                                      replaces=rnd.choice(added)))
                added.append(record_id_for(f"crash{run}", agent, cid))
            elif roll < 0.9:
                cmds.append(DeleteMemory(**common, record_id=rnd.choice(added), session="s"))
            else:
                cmds.append(PinMemory(**common, record_id=rnd.choice(added), session="s"))
    return cmds


def pure_events(cmds: list) -> list:
    state, out = LedgerState(), []
    for c in cmds:
        for e in decide(state, c):
            evolve(state, e)
            out.append(e)
    return out


async def read_all(bootstrap: str, topic: str, partitions: int) -> list:
    async with TopicReader(Settings(kafka_bootstrap=bootstrap)) as r:
        return await r.read_all([TopicPartition(topic, p) for p in range(partitions)])


def of_run(msgs: list, run: str) -> list:
    """The run's event messages (a tenant is never sealed): the bare deployment's log holds its
    earlier modules' too."""
    return [m for m in msgs if json.loads(m.value)["tenant"] == f"crash{run}"]


# On the bare deployment (tests/stacks.py): the test compares the run's events with a pure run of
# the rules, and the memory index's point count with the fold of the whole log, so no other test
# may write to them meanwhile.
async def test_kill_9_mid_stream_loses_and_doubles_nothing(bare_stack):
    stack, settings = bare_stack.stack, bare_stack.settings
    prefix = settings.topic_prefix
    stack.start_all(("ledger", "redis-projection", "embedding"))  # what the commands pass through, and the API
    run = uuid.uuid4().hex[:6]
    cmds = make_commands(run)
    assert len(cmds) == AGENTS * PER_AGENT
    commands_topic, events_topic = prefix + COMMANDS.name, prefix + EVENTS.name
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, enable_idempotence=True, linger_ms=20)
    await producer.start()
    opening = keys_at(settings)()  # the deployment's keys: events and views are sealed
    redis = RedisRecords(redis_at(settings.redis_url)(pooled=True), namespace=prefix, codec=opening)
    keys = None
    watcher = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, group_id=None,
                               isolation_level="read_committed")
    await watcher.start()
    tps = [TopicPartition(events_topic, p) for p in range(EVENTS.partitions)]
    before = sum((await watcher.end_offsets(tps)).values())  # the earlier modules' events
    try:
        half = len(cmds) // 2
        for c in cmds[:half]:
            await producer.send(commands_topic, encode(c), key=COMMANDS.key_bytes(c))
        await producer.flush()

        # The kill point: once the ledger has committed KILL_AFTER offsets of the event log,
        # watched closely enough that it is still deciding the first half's commands.
        async def committed_offsets():
            n = sum((await watcher.end_offsets(tps)).values()) - before
            return n if n >= KILL_AFTER else None

        at_kill = await eventually(committed_offsets, timeout=60, interval=0.01)
        stack.kill("ledger", signal.SIGKILL)
        stack.kill("redis-projection", signal.SIGKILL)
        # Reached the point, and killed mid-burst: the log holds some, not all, of the
        # events the first half's commands make.
        killed_with = len(of_run(await read_all(settings.kafka_bootstrap, events_topic, EVENTS.partitions), run))
        first_half = len(pure_events(cmds[:half]))
        assert at_kill >= KILL_AFTER and 0 < killed_with < first_half, (at_kill, killed_with, first_half)
        for c in cmds[half:]:
            await producer.send(commands_topic, encode(c), key=COMMANDS.key_bytes(c))
        await producer.flush()
        stack.start("ledger")
        stack.start("redis-projection")

        expected = pure_events(cmds)
        per_command = defaultdict(list)
        for e in expected:
            per_command[e.command_id].append(e)

        async def all_events():
            msgs = await read_all(settings.kafka_bootstrap, events_topic, EVENTS.partitions)
            return msgs if len(of_run(msgs, run)) >= len(expected) else None

        msgs = await eventually(all_events, timeout=180, interval=1)
        keys = await open_keys(settings, opening, follow=False)
        got = [opening.decode(EVENTS.name, m.value) for m in of_run(msgs, run)]
        ids = [e.event_id for e in got]
        assert len(ids) == len(set(ids)), "an event was written twice"
        # Same events as a pure run of the rules, per agent in command order.
        by_agent_got, by_agent_exp = defaultdict(list), defaultdict(list)
        for e in got:
            by_agent_got[e.agent].append(e)
        for e in expected:
            by_agent_exp[e.agent].append(e)
        assert by_agent_got == by_agent_exp
        assert {e.command_id for e in got} >= {c.command_id for c in cmds}

        fold = MemoryFold()
        await fold.apply(got)

        async def redis_matches():
            for (t, a, rid), v in fold.current.items():
                r = await redis.get(t, a, rid)
                if r is None or r.version != v:
                    return False
            return True

        await eventually(redis_matches, timeout=120, interval=1)
        for (t, a, rid) in list(fold.versions)[:300]:
            assert await redis.history(t, a, rid) == await fold.history(t, a, rid)
        for a in range(0, AGENTS, 10):
            assert (await redis.page(f"crash{run}", f"agent{a}", 500)).records == (
                await fold.page(f"crash{run}", f"agent{a}", 500)
            ).records
            assert await redis.pinned(f"crash{run}", f"agent{a}") == await fold.pinned(f"crash{run}", f"agent{a}")

        everyone = MemoryFold()  # the index holds the earlier modules' records too
        await everyone.apply([opening.decode(EVENTS.name, m.value) for m in msgs])
        active = sum(1 for k, v in everyone.current.items() if everyone.versions[k][v].status is Status.ACTIVE)

        async def qdrant_matches():
            async with httpx.AsyncClient() as h:
                return (await h.get(f"{stack.api_url}/health")).json()["projection"]["points"] == active

        await eventually(qdrant_matches, timeout=120, interval=1)
    finally:
        await watcher.stop()
        await producer.stop()
        await redis.aclose()
        if keys is not None:
            await keys.stop()
