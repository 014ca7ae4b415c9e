"""Trust and concurrency through Kafka: a stale `expected_version` is refused (409) naming the
record's current version and changes nothing; searches and recalls of a record raise its
usage count (memlane.usage -> the trust worker -> the ledger -> the projection) at the same
version, and every search hit shows its trust breakdown."""

from __future__ import annotations

import uuid

import httpx
import pytest

from events import AgentConfig
from services.client import MemlaneClient
from tests.conftest import eventually, refused
from tests.e2e.extraction_support import new_agent

# The trust worker runs inside the ledger's process; search needs the embedder and the view.
CONFIG = {"memory": {"scope": {"read": ["agent"], "write": ["agent"]}, "pinned": {"max_tokens": 100},
                     "tools": ["add_memory", "read_memory", "delete_memory", "pin_memory", "unpin_memory"]}}


@pytest.fixture(scope="module")
def tstack(stack):
    return stack

async def test_a_stale_expected_version_gets_409_naming_the_current_version_and_changes_nothing(tstack, settings):
    _, _, key = await new_agent(tstack.api_url, settings.operator_key, AgentConfig.model_validate(CONFIG))
    async with MemlaneClient(tstack.api_url, key) as c:
        rid = (await c.add_memory("Deploys happen on Tuesdays", expected_version=0))["id"]
        await c.pin(rid, expected_version=1)  # version 2 now
        before = await c.read_memory(rid)
        assert (before.version, before.pinned) == (2, True)
        # A writer that read version 1 is too late, whichever write it makes.
        for call in (c.delete_memory(rid, expected_version=1), c.unpin(rid, expected_version=1),
                     c.add_memory("Deploys happen on Thursdays", replaces=rid, expected_version=1)):
            e = await refused(call, 409, "VERSION_CONFLICT", "expected_version")
            assert e.message == "expected version 1 but the record is at version 2; read it again and retry"
        assert await c.read_memory(rid) == before
        assert [r.version for r in await c.history(rid)] == [2, 1]
        # Read again, then retry: applied.
        done = await c.delete_memory(rid, expected_version=before.version)
        assert done["memories"][0]["status"] == "DELETED"


async def test_searches_and_recalls_raise_the_usage_count_and_hits_show_trust(tstack, settings):
    _, _, key = await new_agent(tstack.api_url, settings.operator_key, AgentConfig.model_validate(CONFIG))
    async with MemlaneClient(tstack.api_url, key) as c, httpx.AsyncClient(
            base_url=tstack.api_url, headers={"Authorization": f"Bearer {key}"}) as http:
        rid = (await c.add_memory("The staging database is called heron", importance=0.9, confidence=0.8))["id"]
        first = (await http.post("/v1/memory/search", json={"query": "staging database heron"})).json()["records"]
        assert [h["id"] for h in first] == [rid]
        trust = first[0]["trust"]
        assert set(trust["inputs"]) == {"confidence", "importance", "usage", "utility", "stability"}
        assert (trust["inputs"]["importance"]["value"], trust["inputs"]["confidence"]["value"]) == (0.9, 0.8)
        assert 0 < trust["score"] <= 1
        await c.search_memory("heron database")
        recalled = await c.recall(f"conv-{uuid.uuid4().hex[:6]}", "what is the staging database called?")
        assert rid in [r["id"] for r in recalled["workspaceEntries"]]

        async def counted():
            r = await c.read_memory(rid)
            return r if r.usage_count >= 3 else None

        r = await eventually(counted, timeout=20)
        assert (r.usage_count, r.version) == (3, 1)  # usage makes no version
        hit = (await http.post("/v1/memory/search", json={"query": "staging database heron"})).json()["records"][0]
        assert hit["trust"]["inputs"]["usage"]["usage_count"] >= 3
        assert hit["trust"]["score"] > trust["score"]
