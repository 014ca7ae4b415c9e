"""`POST /v1/undo` and `memlane undo` on the shared stack: a command's writes are taken back and
later unrelated writes stay; a later write that depends on an undone one stops the undo (409 naming
`force`) until the operator goes on; the undo is itself undone from the CLI."""

from __future__ import annotations

import asyncio
import json

import httpx

from services.client import MemlaneClient
from tests.e2e.cli_support import AGENT_MEMORY, memlane


async def test_an_undo_takes_back_a_commands_writes_and_is_itself_undone(stack, settings, new_agent):
    tenant, agent, key = await new_agent(AGENT_MEMORY)
    async with MemlaneClient(stack.api_url, key) as c:
        wrong = await c.add_memory("The launch moved to May", scope="AGENT", command_id="bad-import-1")
        kept = await c.add_memory("The office closes at six", scope="AGENT")
        pinned = await c.add_memory("Deploys happen on Thursdays", scope="AGENT", command_id="bad-import-2")
        await c.pin(pinned["id"])  # a later write, by another command, to what bad-import-2 made
    op = {"Authorization": f"Bearer {settings.operator_key}", "X-Tenant": tenant, "X-Agent": agent}
    async with httpx.AsyncClient(base_url=stack.api_url, headers=op, timeout=60) as http:
        plan = (await http.post("/v1/undo", json={"command_id": "bad-import-1", "preview": True})).json()
        assert plan["status"] == "preview" and plan["dependents"] == []
        assert [(x["record_id"], x["status"]) for x in plan["changes"]] == [(wrong["id"], "DELETED")]
        done = (await http.post("/v1/undo", json={"command_id": "bad-import-1"})).json()
        assert done["status"] == "applied" and done["undo_command_id"].startswith("undo-")
        stopped = await http.post("/v1/undo", json={"command_id": "bad-import-2"})
        assert stopped.status_code == 409 and stopped.json()["error"]["field"] == "force"
        assert f"record {pinned['id']} version 2" in stopped.json()["error"]["message"]
        bad = await http.post("/v1/undo", json={"command_id": "c", "session": "s"})
        assert bad.status_code == 422
    async with MemlaneClient(stack.api_url, key) as c:
        assert sorted(r["summary"] for r in (await c.list_memory())["records"]) == [
            "Deploys happen on Thursdays", "The office closes at six"]
        assert (await c.read_memory(wrong["id"])).status.value == "DELETED"
        assert (await c.read_memory(kept["id"])).version == 1  # untouched
    # The operator takes the undo back from the CLI: the record is live again, a version later.
    r = await asyncio.to_thread(memlane, stack, "undo", "--tenant", tenant, "--agent", agent,
                                "--command", done["undo_command_id"], "--yes")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["records"] == 1
    async with MemlaneClient(stack.api_url, key) as c:
        back = await c.read_memory(wrong["id"])
        assert (back.status.value, back.version, back.summary) == ("ACTIVE", 3, "The launch moved to May")
    # Without --force the CLI stops on the dependent pin, naming it.
    r = await asyncio.to_thread(memlane, stack, "undo", "--tenant", tenant, "--agent", agent,
                                "--command", "bad-import-2", "--yes")
    assert r.returncode == 1 and "depends on it" in r.stdout and "--force" in r.stderr
