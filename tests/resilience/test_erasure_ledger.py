"""Keys destroyed by the ledger after an erasure. A ledger killed (kill -9) after it committed a
`SubjectErased` and before it destroyed the subject's keys destroys them when it recovers: a
keyring loaded afresh from `memlane.keys` no longer knows the member's keys, and still knows the
other member's. A ledger restarted after that skips, and counts, the events it can no longer
open, and goes on deciding. Live, a member removed tenant-wide and a removed agent lose their
keys at once."""

from __future__ import annotations

import json
import uuid
from datetime import datetime

import httpx
from aiokafka import AIOKafkaProducer
from fastapi import FastAPI

from events import AddMemory, AgentConfig, ConfigureAgent
from events.base import utcnow
from events.codec import PLAIN
from events.commands import WORKSPACE, DeleteMemory, EraseSubject, RemoveAgent, RemoveUser
from events.record import Provenance, Source
from events.topics import COMMANDS, EVENTS
from projections.redis.record_view import RedisRecords
from services.auth import KeyStore
from services.bootstrap import keys_at
from services.http import errors
from services.http.routes import subjects as subjects_routes
from services.memory import MemoryService
from services.memory.kafka import KafkaCommandPublisher, KafkaUsageRecorder
from services.stack import Stack
from settings import Settings
from tests.conftest import eventually
from tests.e2e.extraction_support import read_topic_at
from tests.redis_at import redis_at
from workers.runtime.data_keys import open_keys
from workers.runtime.kafka_io import ensure_topics
from workers.runtime.kafka_io import producer as kafka_producer

AGENT = "eraser"
MEMORY = {"scope": {"read": ["session", "user"], "write": ["session", "user"]}}


def fact(tenant: str, cmd_id: str, user: str, summary: str, at: datetime) -> AddMemory:
    return AddMemory(command_id=cmd_id, tenant=tenant, agent=AGENT, issued_at=at, user=user, scope="USER",
                     session="s1", summary=summary, provenance=Provenance(user=user, session="s1"))


async def send(s: Settings, cmds: list) -> None:
    """As the API sends commands: sealed, the keys they were sealed under published first."""
    codec = keys_at(s)()
    keys = await open_keys(s, codec, follow=False)
    producer = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap)
    await producer.start()
    try:
        data = [(codec.encode(c), COMMANDS.key_bytes(c)) for c in cmds]
        await keys.flush()
        for value, key in data:
            await producer.send_and_wait(s.topic(COMMANDS.name), value, key=key)
    finally:
        await producer.stop()
        await keys.stop()


async def events(s: Settings, tenant: str, *agents: str) -> list[dict]:
    """The tenant's agents' committed events as JSON, sealed fields and all (their ids, types and codes never are)."""
    return [e for e in (json.loads(v) for _, _, v, _ in await read_topic_at(s, EVENTS.name))
            if e["tenant"] == tenant and e["agent"] in agents]


async def event_types(s: Settings, tenant: str, agents: tuple[str, ...] = (AGENT,)) -> list[str]:
    return [e["type"] for e in await events(s, tenant, *agents)]


async def subjects(s: Settings, tenant: str) -> dict[str, int]:
    """How many data keys a keyring loaded afresh from the keys topic knows, per subject of the tenant."""
    keys = await open_keys(s, keys_at(s)(), follow=False)
    try:
        ring = keys.keyring
        return {subject.split("/", 1)[1]: len(ring.kids(subject)) for subject in ring.subjects()
                if subject.startswith(f"{tenant}/")}
    finally:
        await keys.stop()


async def kids(s: Settings, tenant: str) -> dict[str, int]:
    """How many data keys the agent's members have, as `subjects` counts them."""
    known = await subjects(s, tenant)
    return {u: known.get(f"{AGENT}|u:{u}", 0) for u in ("u1", "u2")}


def on_the_workspace_partition(tenant: str, *agents: str) -> int:
    """How many of the agents are on the workspace agent's partition, where the fold itself forgets."""
    here = COMMANDS.partition_of(f"{tenant}/{WORKSPACE}".encode())
    return sum(COMMANDS.partition_of(f"{tenant}/{a}".encode()) == here for a in agents)


def logged(stack: Stack, event: str) -> list[dict]:
    """The ledger's log lines of `event`, of every run in this test, oldest first."""
    lines = (json.loads(line) for line in (stack.log_dir / "ledger.log").read_text().splitlines()
             if line.startswith("{"))
    return [line for line in lines if line.get("event") == event]


# On the bare deployment (tests/stacks.py): a ledger of the test's own, whose log lines it reads.
async def test_a_ledger_killed_before_destroying_an_erasures_keys_destroys_them_when_it_recovers(bare_stack):
    stack, s = bare_stack.stack, bare_stack.settings
    tenant = "t1"  # each test its own: they share the deployment's keys topic
    await ensure_topics(s)
    stack.start("ledger", MEMLANE_LEDGER_ERASURE_DELAY_S="600")  # it commits the erasure, then waits: killed there
    # Stamped now, as the API stamps commands: an erasure takes the keys made before it.
    await send(s, [
        ConfigureAgent(command_id="cfg", tenant=tenant, agent=AGENT, issued_at=utcnow(),
                       config=AgentConfig.model_validate({"memory": MEMORY})),
        fact(tenant, "f1", "u1", "CANARY u1 keeps bees", utcnow()),
        fact(tenant, "f2", "u2", "u2 keeps fish", utcnow()),
    ])

    async def added() -> bool:
        return (await event_types(s, tenant)).count("RecordAdded") == 2

    await eventually(added, timeout=90)
    assert await kids(s, tenant) == {"u1": 1, "u2": 1}

    await send(s, [EraseSubject(command_id="erase-u1", tenant=tenant, agent=AGENT, user="u1",
                                issued_at=utcnow(), provenance=Provenance(source=Source.OPERATOR))])

    async def erased() -> bool:
        return "SubjectErased" in await event_types(s, tenant)

    await eventually(erased, timeout=60)
    stack.kill("ledger")
    assert await kids(s, tenant) == {"u1": 1, "u2": 1}  # killed before it destroyed anything

    stack.start("ledger")

    async def destroyed() -> bool:
        return await kids(s, tenant) == {"u1": 0, "u2": 1}

    await eventually(destroyed, timeout=90)
    # Its log line follows the destruction the keys topic shows: wait for it, then check it is the only one.
    await eventually(lambda: logged(stack, "ledger_keys_destroyed") or None, timeout=30)
    assert [(e["keys"], e["after_recovery"]) for e in logged(stack, "ledger_keys_destroyed")] == [(1, True)]

    # Restarted again, the ledger cannot open u1's events any more: it skips and counts them,
    # and still decides.
    stack.kill("ledger")
    stack.start("ledger")
    await send(s, [fact(tenant, "f3", "u2", "u2 keeps two fish", utcnow())])

    async def decided() -> bool:
        return (await event_types(s, tenant)).count("RecordAdded") == 3

    await eventually(decided, timeout=90)
    # The third run's recovery of the agent's partition: u1's record and its tombstone.
    here = COMMANDS.partition_of(f"{tenant}/{AGENT}".encode())
    assert [e.get("unreadable") for e in logged(stack, "ledger_recovered") if e["partition"] == here][-1] == 2


async def test_a_member_removed_from_the_tenant_and_a_removed_agent_lose_their_keys_at_once(bare_stack):
    """Live, with no crash: a member removed under the workspace agent loses their keys on every
    agent, and every partition the ledger holds forgets their facts (a later delete of one finds
    nothing, rather than writing it again under a new key); a removed agent loses its keys and its
    members'. Another member's and another agent's keys stay."""
    stack, s = bare_stack.stack, bare_stack.settings
    tenant = "t2"
    await ensure_topics(s)
    stack.start("ledger")
    other = "keeper"
    cfg = AgentConfig.model_validate({"memory": MEMORY})
    u1_fact = fact(tenant, "g1", "u1", "u1 keeps bees", utcnow())
    await send(s, [
        *(ConfigureAgent(command_id=f"cfg-{a}", tenant=tenant, agent=a, issued_at=utcnow(), config=cfg)
          for a in (AGENT, other)),
        u1_fact, fact(tenant, "g2", "u2", "u2 keeps fish", utcnow()),
        fact(tenant, "g3", "u1", "u1 keeps bees here too", utcnow()).model_copy(update={"agent": other}),
        fact(tenant, "g4", "u2", "u2 keeps fish here too", utcnow()).model_copy(update={"agent": other}),
    ])

    async def added() -> bool:
        return (await event_types(s, tenant, agents=(AGENT, other))).count("RecordAdded") == 4

    await eventually(added, timeout=90)
    assert await subjects(s, tenant) == {f"{a}|u:{u}": 1 for a in (AGENT, other) for u in ("u1", "u2")}

    await send(s, [RemoveUser(command_id="remove-u1", tenant=tenant, agent=WORKSPACE, user="u1",
                              issued_at=utcnow(), provenance=Provenance(source=Source.OPERATOR))])

    async def removed() -> bool:
        return bool(logged(stack, "ledger_keys_destroyed"))

    await eventually(removed, timeout=60)
    assert await subjects(s, tenant) == {f"{AGENT}|u:u2": 1, f"{other}|u:u2": 1}
    [done] = logged(stack, "ledger_keys_destroyed")
    # Both of u1's facts are forgotten, whichever partitions the workspace and the agents are on.
    assert done["keys"] == 2 and done["records_forgotten"] + on_the_workspace_partition(tenant, AGENT, other) == 2

    [record_added] = [e for e in await events(s, tenant, AGENT) if e["type"] == "RecordAdded" and e["command_id"] == "g1"]
    await send(s, [DeleteMemory(command_id="late-delete", tenant=tenant, agent=AGENT, user="u1", session="s1",
                                record_id=record_added["record"]["id"], issued_at=utcnow())])

    async def answered() -> list[str]:
        return [e.get("code") for e in await events(s, tenant, AGENT) if e["command_id"] == "late-delete"]

    assert await eventually(answered, timeout=60) == ["NOT_FOUND"]

    await send(s, [RemoveAgent(command_id="remove-agent", tenant=tenant, agent=other, issued_at=utcnow(),
                               provenance=Provenance(source=Source.OPERATOR))])

    async def gone() -> bool:
        known = await subjects(s, tenant)
        return known[f"{AGENT}|u:u2"] == 1 and not [k for k in known if k.startswith(f"{other}|")]

    await eventually(gone, timeout=60)


async def test_only_the_deployments_key_removes_a_tenant_and_its_api_keys_go_at_once(settings):
    """`DELETE /v1/tenant` on a real key store (Redis) and commands log (Kafka): refused to the
    tenant's own operator key, answered 202 to the deployment's, which sends `RemoveTenant` under
    the workspace agent and revokes every key the tenant was issued."""
    s = Settings(topic_prefix=f"{settings.topic_prefix}tenant{uuid.uuid4().hex[:4]}.", encryption=False)
    await ensure_topics(s)
    records = RedisRecords(redis_at(s.redis_url)(pooled=True), namespace=s.topic_prefix)
    store = KeyStore(records.r, "the-deployments-own-key", f"ml:{s.topic_prefix}")
    prod = kafka_producer(s)
    await prod.start()
    publisher = KafkaCommandPublisher(s, prod, PLAIN)  # encryption off
    app = FastAPI()
    errors.install(app)
    app.include_router(subjects_routes.router)
    app.state.keys = store
    app.state.service = MemoryService(s, records, None, None, publisher, KafkaUsageRecorder(s, publisher))
    try:
        issued = [await store.issue("gone", "a", "agent"), await store.issue("gone", None, "operator"),
                  await store.issue("gone", None, "member", user="u1")]
        kept, _ = await store.issue("stays", None, "operator")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as api:
            def delete(key: str, **headers: str):
                return api.delete("/v1/tenant", params={"wait": "false"},
                                  headers={"Authorization": f"Bearer {key}", **headers})

            for key, _ in issued[1:]:
                r = await delete(key)  # the tenant's own operator key, or a member's
                assert (r.status_code, r.json()["error"]["code"]) == (403, "FORBIDDEN"), r.text
            r = await delete(kept, **{"X-Tenant": "gone"})  # another tenant's operator key acts on its own
            assert r.status_code == 403
            r = await delete("the-deployments-own-key")
            assert (r.status_code, r.json()["error"]["field"]) == (422, "x-tenant")
            r = await delete("the-deployments-own-key", **{"X-Tenant": "gone"})
            assert r.status_code == 202, r.text
        body = r.json()
        assert (body["status"], body["tenant"]) == ("accepted", "gone")
        assert sorted(body["revoked_keys"]) == sorted(entry["id"] for _, entry in issued)
        assert await store.list("gone") == [] and len(await store.list("stays")) == 1
        assert await store.resolve(issued[0][0]) is None
        sent = await commands(s)
        assert [(c["type"], c["tenant"], c["agent"], c["provenance"]["source"]) for c in sent] == [
            ("RemoveTenant", "gone", WORKSPACE, "OPERATOR")]
    finally:
        await publisher.stop()
        await records.aclose()


async def commands(s: Settings) -> list[dict]:
    return [json.loads(v) for _, _, v, _ in await read_topic_at(s, COMMANDS.name)]
