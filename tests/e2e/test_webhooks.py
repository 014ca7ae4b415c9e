"""Signed webhooks on the shared stack: an operator registers endpoints, the delivery worker reads
the log and delivers `memory.changed`, `turn.processed` and `subject.erased`, signed; an endpoint that fails is
retried, one that keeps failing is parked and replayed with the same ids, and one that stalls
holds up no other."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx
import pytest
from aiokafka import AIOKafkaProducer

from events.rules.webhooks import signature
from events.topics import EVENTS
from services.bootstrap import keys_at
from services.client import MemlaneClient, TurnPublisher
from tests.conftest import eventually
from tests.e2e.extraction_support import answer, turn
from tests.e2e.extraction_support import new_agent as new_model_agent
from tests.e2e.test_members import CONFIG, Members
from workers.followers.webhook_delivery import WebhookDelivery
from workers.runtime.data_keys import open_keys

AGENT_MEMORY = {"memory": {"scope": {"read": ["agent"], "write": ["agent"]}}}


STALL = 0  # an answer that is no answer: the receiver holds the request until the caller hangs up


@dataclass
class Receiver:
    """A local HTTP endpoint: `answer(n)` says what the n-th request gets (a status, or STALL)."""

    answer: Callable[[int], Awaitable[int]]
    got: list[dict] = field(default_factory=list)
    server: asyncio.AbstractServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/hook"

    async def start(self) -> Receiver:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
            headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:] if h)}
            body = (await reader.readexactly(int(headers.get("content-length", 0)))).decode()
            n = len(self.got)
            self.got.append({"headers": headers, "body": body, "status": None})
            status = await self.answer(n)
            if status == STALL:
                await reader.read()  # returns once the worker gives up on the attempt and closes
                return
            self.got[n]["status"] = status
            writer.write(f"HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".encode())
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def delivered(self) -> list[dict]:
        return [json.loads(g["body"]) for g in self.got if g["status"] == 200]

    async def stop(self) -> None:
        self.server.close()


async def status(code: int) -> int:
    return code


@asynccontextmanager
async def delivering(settings, backoff_s: tuple[float, ...]):
    """The delivery worker as `memlane webhooks deliver` runs it (the deployment's keys open the
    secrets), retrying quickly."""
    codec = keys_at(settings)()
    keys = await open_keys(settings, codec)
    w = WebhookDelivery(settings, codec, keys, backoff_s=backoff_s, attempt_timeout_s=1.0)
    task = asyncio.create_task(w.run())
    try:
        yield w
    finally:
        w.stopping.set()
        await asyncio.wait_for(task, 30)
        if keys is not None:
            await keys.stop()


@pytest.fixture
async def worker(settings):
    """The session stack's worker, retrying four times."""
    async with delivering(settings, (0.05, 0.1, 0.2, 0.4)) as w:
        yield w


async def register(stack, settings, tenant: str, url: str, **body) -> dict:
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=30, headers={
            "Authorization": f"Bearer {settings.operator_key}"}) as op:
        r = await op.post("/v1/admin/webhooks", params={"tenant": tenant},
                          json={"url": url, "events": ["memory.changed", "subject.erased"], **body})
        assert r.status_code == 201, r.text
        return r.json()


async def test_deliveries_are_signed_retried_and_parked_then_replayed(stack, settings, new_agent, worker):
    tenant, agent, key = await new_agent(AGENT_MEMORY)

    async def flaky(n: int) -> int:  # two failures, a stall past an attempt's limit, then fine
        return 500 if n < 2 else STALL if n == 2 else 200

    good = await Receiver(flaky).start()
    down = await Receiver(lambda n: status(503)).start()
    hook = await register(stack, settings, tenant, good.url, agent=agent)
    dead = await register(stack, settings, tenant, down.url, agent=agent)
    assert hook["secret"] and "secret" not in json.dumps((await _list(stack, settings, tenant))["webhooks"])
    # A poison event in the agent's partition, before the writes: the worker skips it and goes on.
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(settings.topic(EVENTS.name), json.dumps(
            {"type": "RecordAdded", "command_id": "poison", "tenant": tenant, "agent": agent}).encode(),
            key=f"{tenant}/{agent}".encode())
    finally:
        await producer.stop()
    async with MemlaneClient(stack.api_url, key) as c:
        ids = [(await c.add_memory(f"Fact {i}: the on-call phone is in drawer {i}", scope="AGENT"))["memories"][0]["id"]
               for i in range(3)]
    await eventually(lambda: {d["data"]["record_id"] for d in good.delivered()} == set(ids), timeout=60)
    for g in good.got:  # every attempt signed with the secret shown once
        h = g["headers"]
        assert h["memlane-webhook-signature"] == signature(hook["secret"], int(h["memlane-webhook-timestamp"]),
                                                           g["body"])
    sent = [json.loads(g["body"])["id"] for g in good.got]
    assert len(set(sent)) == 3 and all(json.loads(g["body"])["data"]["action"] == "added" for g in good.got)
    assert "drawer" not in " ".join(g["body"] for g in good.got)  # ids, never text

    # The endpoint that never answered well: each delivery parked after its last attempt, listed, replayed.
    async def parked() -> list[dict]:
        return (await _dead(stack, settings, tenant))["deliveries"]

    async def three_parked() -> bool:
        return len(await parked()) == 3

    await eventually(three_parked, timeout=60)
    first = {json.loads(g["body"])["id"] for g in down.got}
    down.answer = lambda n: status(200)
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=30, headers={
            "Authorization": f"Bearer {settings.operator_key}"}) as op:
        r = await op.post("/v1/admin/webhooks/dead/replay", params={"tenant": tenant}, json={})
        assert r.json() == {"replayed": 3}
    await eventually(lambda: {d["id"] for d in down.delivered()} == first, timeout=60)
    assert await parked() == [] and dead["id"]
    await good.stop()
    await down.stop()


async def test_a_stalled_endpoint_holds_up_no_other(stack, settings, new_agent, worker):
    tenant, agent, key = await new_agent(AGENT_MEMORY)

    # Each attempt stalls until the worker gives up on it: five attempts, some 6 s, for each delivery.
    slow = await Receiver(lambda n: status(STALL)).start()
    fast = await Receiver(lambda n: status(200)).start()
    await register(stack, settings, tenant, slow.url, agent=agent)
    await register(stack, settings, tenant, fast.url, agent=agent)
    async with MemlaneClient(stack.api_url, key) as c:
        await c.add_memory("The deploy freeze starts Friday", scope="AGENT")
        t0 = time.monotonic()
        await c.add_memory("The deploy freeze ends Monday", scope="AGENT")
    await eventually(lambda: len(fast.delivered()) == 2, timeout=30)
    assert time.monotonic() - t0 < 4, "the fast endpoint waited for the stalled one"
    assert not slow.delivered()  # still stalling: its own queue waits
    await slow.stop()
    await fast.stop()


async def test_a_bad_endpoint_or_event_is_refused_naming_the_field(stack, settings, new_agent):
    tenant, _, _ = await new_agent(AGENT_MEMORY)
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=30, headers={
            "Authorization": f"Bearer {settings.operator_key}"}) as op:
        r = await op.post("/v1/admin/webhooks", params={"tenant": tenant},
                          json={"url": "ftp://example.com/x", "events": ["memory.changed"]})
        assert r.status_code == 422 and r.json()["error"]["field"] == "url"
        r = await op.post("/v1/admin/webhooks", params={"tenant": tenant},
                          json={"url": "http://example.com/x", "events": ["memory.exploded"]})
        assert r.status_code == 422 and "events" in r.json()["error"]["field"]
        r = await op.delete("/v1/admin/webhooks/nope", params={"tenant": tenant})
        assert r.status_code == 404 and r.json()["error"]["field"] == "webhook_id"


async def _list(stack, settings, tenant: str) -> dict:
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=30, headers={
            "Authorization": f"Bearer {settings.operator_key}"}) as op:
        return (await op.get("/v1/admin/webhooks", params={"tenant": tenant})).json()


async def _dead(stack, settings, tenant: str) -> dict:
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=30, headers={
            "Authorization": f"Bearer {settings.operator_key}"}) as op:
        return (await op.get("/v1/admin/webhooks/dead", params={"tenant": tenant})).json()



async def test_text_goes_only_where_asked_and_never_a_members(stack, settings, worker):
    m = Members(stack.api_url, settings.operator_key, f"ten{uuid.uuid4().hex[:6]}", f"agent{uuid.uuid4().hex[:6]}")
    async with m.op() as op:
        await op.configure(CONFIG)
        m.keys["agent"], m.keys["dana"] = (await op.issue_key(m.tenant, m.agent),
                                           await op.issue_key(m.tenant, m.agent, "member", user="dana"))
    async with m.as_member("dana") as dana:
        await dana.grant_consent()
    told, plain = await Receiver(lambda n: status(200)).start(), await Receiver(lambda n: status(200)).start()
    await register(stack, settings, m.tenant, told.url, agent=m.agent, events=["memory.changed"], include_text=True)
    await register(stack, settings, m.tenant, plain.url, agent=m.agent, events=["memory.changed"])
    async with m.op() as op:
        shared = (await op.add_memory("The office closes at 18:00", scope="AGENT"))["memories"][0]["id"]
    # A member's fact, and a record made in her conversation: both hers, neither told.
    async with m.as_agent(user="dana") as agent:
        hers = (await agent.add_memory("Dana's cat is named Miso"))["memories"][0]["id"]
        also_hers = (await agent.add_memory("Dana asked about the Miso vet", scope="AGENT"))["memories"][0]["id"]

    async def both_told() -> bool:
        return all({d["data"]["record_id"] for d in r.delivered()} == {shared, hers, also_hers} for r in (told, plain))

    await eventually(both_told, timeout=60)
    with_text = {d["data"]["record_id"]: d["data"] for d in told.delivered()}
    assert with_text[shared]["summary"] == "The office closes at 18:00"
    assert with_text[shared].get("user") is None and with_text[shared]["content"] == ""
    assert with_text[hers]["user"] == "dana" and "summary" not in with_text[hers]
    assert "summary" not in with_text[also_hers]
    assert "Miso" not in " ".join(g["body"] for g in told.got)
    assert "18:00" not in " ".join(g["body"] for g in plain.got)
    await told.stop()
    await plain.stop()


@pytest.fixture
async def model_worker(model_stack):
    """The delivery worker of the model stack, whose extraction worker reviews turns."""
    async with delivering(model_stack[1], (0.05,)) as w:
        yield w


async def test_a_turns_review_is_told_with_what_it_decided(model_stack, fake, model_worker):
    stack, msettings = model_stack
    tenant, agent, key = await new_model_agent(stack.api_url, msettings.operator_key)
    got = await Receiver(lambda n: status(200)).start()
    await register(stack, msettings, tenant, got.url, agent=agent, events=["turn.processed"])
    m = f"mk{uuid.uuid4().hex[:10]}"
    fake.on(m, answer({"decision": "add", "handle": None, "kind": "fact", "labels": {}, "scope": "session",
                       "summary": f"Customer {m} is based in Lyon", "content": "", "source_message_ids": ["s1-1-0"]},
                      {"decision": "skip", "handle": None, "kind": "fact", "labels": {}, "scope": "session",
                       "summary": "", "content": "", "source_message_ids": []}))
    async with TurnPublisher(msettings.kafka_bootstrap, msettings.topic_prefix) as pub:
        await pub.publish(turn(tenant, agent, "s1", 1, f"I am {m}, based in Lyon", "Noted."))
        await pub.publish(turn(tenant, agent, "s1", 2, "and one more thing", status="failed"))

    async def both():
        return got.delivered() if len(got.delivered()) >= 2 else None

    told = sorted(await eventually(both, timeout=40), key=lambda b: b["data"]["turn"])
    assert [b["type"] for b in told] == ["turn.processed", "turn.processed"]
    reviewed, failed = (b["data"] for b in told)
    assert reviewed["reviewed"] is True and reviewed["session"] == "s1" and reviewed["skipped"] == 1
    [decision] = reviewed["decided"]
    assert decision["decision"] == "add" and decision["kind"] == "fact"
    assert failed == {"session": "s1", "turn": 2, "reviewed": False, "reason": "turn_not_completed"}
    # The id it reports is the record the ledger wrote; the notice holds no text.
    async with MemlaneClient(stack.api_url, key, session="s1") as c:
        assert (await c.read_memory(decision["record_id"])).summary == f"Customer {m} is based in Lyon"
    assert m not in json.dumps(told) and "Lyon" not in json.dumps(told)
    await got.stop()
