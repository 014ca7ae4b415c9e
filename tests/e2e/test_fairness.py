"""A tenant with as many queries waiting to be embedded as it may gets 429 with Retry-After,
over HTTP, while another tenant's search is answered (docs/features/fairness.md)."""

from __future__ import annotations

import asyncio
import re
import uuid

import httpx

from events import AgentConfig
from tests.conftest import eventually

CONFIG = AgentConfig.model_validate({"memory": {"scope": {"read": ["agent"], "write": ["agent"]}}})


def long_batch() -> dict:
    """100 queries of about 3,900 characters: each its own embedder call, tens of ms each."""
    return {"searches": [{"query": f"{uuid.uuid4().hex} " + "noise words " * 320} for _ in range(100)]}


def queued(api_url: str) -> float:
    text = httpx.get(f"{api_url}/metrics", timeout=10).text
    return float(re.search(r"^memlane_embed_queued_texts (\S+)$", text, re.M).group(1))


async def test_a_tenant_past_its_queue_gets_429_with_retry_after_and_another_is_served(stack, new_agent):
    _, _, hostile = await new_agent(CONFIG)
    _, _, other = await new_agent(CONFIG)
    auth = {"Authorization": f"Bearer {hostile}"}
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=120, headers=auth) as h, \
            httpx.AsyncClient(base_url=stack.api_url, timeout=60, headers={"Authorization": f"Bearer {other}"}) as o:
        admitted = [asyncio.create_task(h.post("/v1/memory/search/batch", json=long_batch())) for _ in range(2)]
        # The barrier: both batches' 200 queries are waiting (the bound is 256).
        await eventually(lambda: queued(stack.api_url) >= 200, timeout=30, interval=0.02)
        r = await h.post("/v1/memory/search/batch", json=long_batch())
        assert r.status_code == 429, r.text
        assert r.json()["error"]["code"] == "RATE_LIMITED" and "at most 256" in r.json()["error"]["message"]
        assert int(r.headers["Retry-After"]) >= 1
        # Another tenant is answered meanwhile.
        r = await o.post("/v1/memory/search", json={"query": "where is the office?"})
        assert r.status_code == 200, r.text
        for done in await asyncio.gather(*admitted):
            assert done.status_code == 200 and all("records" in x for x in done.json()["results"]), done.text[:300]
    assert queued(stack.api_url) == 0
