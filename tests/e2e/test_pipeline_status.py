"""GET /v1/admin/pipeline on the running stack: a poison command the ledger dead-letters shows
in the commands' DLQ (its headers to the deployment's key only, never its value), a recall
shows in the tenant's activity, and only operator keys may ask."""

from __future__ import annotations

import uuid
from functools import partial

import httpx

from events.topics import COMMANDS
from services.client import MemlaneClient
from services.pipeline_status import DLQ_HEADERS, PEEK, origin
from tests.conftest import eventually
from tests.e2e.extraction_support import send_poison_command

DLQ = COMMANDS.dlq


async def _get(stack, key: str, **kw) -> httpx.Response:
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=15) as h:
        return await h.get("/v1/admin/pipeline", headers={"Authorization": f"Bearer {key}", **kw.pop("headers", {})},
                           **kw)


async def test_operators_see_the_pipeline_and_only_the_deployment_sees_dead_letter_headers(stack, settings, new_agent):
    tenant, agent, agent_key = await new_agent()
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
        tenant_op = await op.issue_key(tenant, None, "operator")
    before = (await _get(stack, settings.operator_key)).json()["dlq"][DLQ]["size"]

    # A command that breaks the contract: the ledger parks it in the commands' DLQ.
    sent = await send_poison_command(settings, tenant, agent)
    async with MemlaneClient(stack.api_url, agent_key, session="s1") as c:
        await c.add_memory("The customer prefers email", kind="fact")
        await c.recall("conv-1", "how should I reach the customer?")

    async def parked():
        body = (await _get(stack, settings.operator_key)).json()
        return body if body["dlq"][DLQ]["size"] > before else None

    body = await eventually(parked, timeout=60)
    letters = body["dlq"][DLQ]["messages"]
    assert 1 <= len(letters) <= PEEK and all(set(m) == {"offset", "timestamp", "headers"} for m in letters)
    ours = [m for m in letters if (m["headers"].get("source_partition"), m["headers"].get("source_offset"))
            == (str(sent.partition), str(sent.offset))]
    if before < PEEK:  # among the first PEEK messages of the topic, so shown
        [letter] = ours
        assert set(letter["headers"]) <= set(DLQ_HEADERS)
        assert letter["headers"]["source_topic"] == settings.topic(COMMANDS.name)
        assert letter["headers"]["consumer_group"].endswith("ledger") and letter["headers"]["error"]
    assert set(body) >= {"workers", "dlq", "projection", "model", "activity", "errors"}
    assert body["workers"]["ledger"]["alive"] and body["projection"]["generation"] >= 1
    assert body["model"]["embeddings"]["provider"] == settings.embeddings

    # A tenant's operator key: sizes, not headers; its tenant's activity, with the recall in it.
    async def recalled(key, **kw):
        r = await _get(stack, key, **kw)
        assert r.status_code == 200, r.text
        return r.json() if sum(r.json()["activity"]["recalls"]) >= 1 else None

    mine = await eventually(partial(recalled, tenant_op), timeout=30)
    assert sum(mine["activity"]["recalls"]) == 1 and sum(mine["activity"]["turns"]) == 0
    assert all("messages" not in d and isinstance(d["size"], int) for d in mine["dlq"].values())
    assert mine["dlq"][DLQ]["size"] >= body["dlq"][DLQ]["size"]
    # The deployment's key names the tenant to see its chart alone. The chart is per minute: two
    # reads either side of a minute's turn see it shifted by one, so both are read in one minute.
    async def same_minute():
        a = await recalled(tenant_op)
        b = await recalled(settings.operator_key, params={"tenant": tenant})
        return (a, b) if a["activity"]["minutes"] == b["activity"]["minutes"] else None

    ours, scoped = await eventually(same_minute, timeout=30)
    assert scoped["activity"]["recalls"] == ours["activity"]["recalls"]

    refused = await _get(stack, tenant_op, params={"tenant": "someone-else"})
    assert (refused.status_code, refused.json()["error"]["field"]) == (403, "tenant")
    agent_call = await _get(stack, agent_key)
    assert (agent_call.status_code, agent_call.json()["error"]["code"]) == (403, "FORBIDDEN")
    assert (await _get(stack, f"nokey-{uuid.uuid4().hex}")).status_code == 401
    async with httpx.AsyncClient(base_url=stack.api_url) as h:
        health = (await h.get("/health")).json()
    assert not [p for p in health["problems"] if "activity" in p], health


def test_the_model_base_url_is_shown_without_its_secrets():
    assert origin("https://user:sk-secret@llm.example.com/v1?key=sk-2") == "https://llm.example.com:443"
    assert origin("http://127.0.0.1:8081/v1") == "http://127.0.0.1:8081"
    assert origin("http://[::1]:9000/x") == "http://[::1]:9000"
    assert origin("") is None and origin("not a url") is None
