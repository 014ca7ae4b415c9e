"""Operator reads across sessions, edits (PATCH) and the expiry sweep (`memlane sweep`), through Kafka and the ledger."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

from events import AgentConfig
from events.base import utcnow
from services.client import MemlaneClient
from tests.conftest import eventually, refused
from tests.e2e.test_memory_api import BOTH_SCOPES


async def test_an_operator_lists_and_reads_every_sessions_and_preview_records(stack, new_agent, settings):
    # An operator's listing shows every session's and preview records; its read reaches any of the agent's.
    tenant, agent, key = await new_agent(AgentConfig.model_validate(BOTH_SCOPES))
    async with MemlaneClient(stack.api_url, key, session="s1") as s1, MemlaneClient(
        stack.api_url, key, session="s2", preview=True
    ) as s2_preview, MemlaneClient(stack.api_url, key) as sessionless:
        one = await s1.add_memory("Account 4471 is overdrawn")
        two = await s2_preview.add_memory("Draft: account 9 is closed")
        shared = await s1.add_memory("The agent speaks Portuguese", scope="AGENT")
        assert [r["id"] for r in (await sessionless.list_memory())["records"]] == [shared["id"]]
        await refused(sessionless.read_memory(one["id"]), 404, "NOT_FOUND")
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
        assert [r["id"] for r in (await op.list_memory())["records"]] == [shared["id"], two["id"], one["id"]]
        assert (await op.read_memory(two["id"])).preview is True
        assert [v.version for v in await op.history(one["id"])] == [1]


async def test_an_operator_edit_makes_a_successor_and_agents_cannot_edit(stack, new_agent, settings):
    tenant, agent, key = await new_agent()
    async with MemlaneClient(stack.api_url, key, session="s1") as c, MemlaneClient(
        stack.api_url, settings.operator_key, tenant=tenant, agent=agent, session="s1"
    ) as op:
        old = await c.add_memory("Support hours are 9 to 5", kind="fact")
        await refused(c.edit_memory(old["id"], summary="Support hours are 8 to 6"), 403, "FORBIDDEN")
        same = await op.edit_memory(old["id"], summary="Support hours are 9 to 5")
        assert same["merged"] and same["id"] == old["id"]
        edited = await op.edit_memory(old["id"], summary="Support hours are 8 to 6")
        assert edited.get("id") not in (None, old["id"]), edited
        history = await c.history(old["id"])
        assert [(v.version, v.status.value, v.replaced_by) for v in history] == [
            (2, "SUPERSEDED", edited["id"]), (1, "ACTIVE", None)]
        successor = await c.read_memory(edited["id"])
        assert successor.replaces == old["id"] and successor.provenance.source.value == "OPERATOR"
        hits, _ = await c.search_memory("support hours", mode="lexical")
        assert [h.record.summary for h in hits] == ["Support hours are 8 to 6"]
        await refused(op.edit_memory(edited["id"], summary="x" * 600), 422, "VALIDATION_FAILED", "summary")


async def test_the_sweep_tombstones_expired_records_through_the_ledger(stack, new_agent):
    _, _, key = await new_agent()
    now = utcnow()
    async with MemlaneClient(stack.api_url, key, session="s1") as c:
        promo = await c.add_memory("Promo code SPRING applies this week", expires_at=(now + timedelta(days=7)).isoformat())
        kept = await c.add_memory("The customer prefers email", kind="fact")
        at = now + timedelta(days=8)
        proc = subprocess.run([sys.executable, "-m", "services.cli", "sweep", "--at", at.isoformat()],
                              env=stack.env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "sent expiry sweeps" in proc.stdout and "naming 0 records" not in proc.stdout

        async def swept():
            return (await c.read_memory(promo["id"])).status.value == "DELETED"

        await eventually(swept, timeout=30)
        gone = await c.read_memory(promo["id"])
        assert gone.version == 2 and gone.valid_to is not None and gone.provenance.source.value == "OPERATOR"
        assert (await c.read_memory(kept["id"])).status.value == "ACTIVE"
        hits, _ = await c.search_memory("promo code SPRING", mode="lexical")
        assert promo["id"] not in [h.record.id for h in hits]

    bad = subprocess.run([sys.executable, "-m", "services.cli", "sweep", "--at", "tomorrow"], env=stack.env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--at must be an ISO 8601 time" in bad.stderr
