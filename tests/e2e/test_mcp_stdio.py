"""`memlane mcp` as an agent framework runs it: the installed command, the agent's key in
MEMLANE_API_KEY, JSON-RPC over its stdin and stdout."""

from __future__ import annotations

import json
import select
import subprocess
import sys
from pathlib import Path

from services.client import MemlaneClient
from tests.conftest import eventually


class Stdio:
    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.ids = proc, 0

    def send(self, method: str, params: dict | None = None, reply: bool = True, timeout: float = 30) -> dict | None:
        msg: dict = {"jsonrpc": "2.0", "method": method, **({"params": params} if params is not None else {})}
        if reply:
            self.ids += 1
            msg["id"] = self.ids
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()
        if not reply:
            return None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"no answer to {method} within {timeout} s"
        answer = json.loads(self.proc.stdout.readline())
        assert answer["id"] == self.ids and "error" not in answer, answer
        return answer["result"]

    def tool(self, name: str, **arguments) -> dict:
        result = self.send("tools/call", {"name": name, "arguments": arguments})
        assert result["isError"] is False, result
        return json.loads(result["content"][0]["text"])


async def test_memlane_mcp_over_stdio_offers_the_tools_finds_and_stores_records(stack, new_agent):
    _, _, key = await new_agent({"memory": {"tools": ["add_memory", "read_memory"]}})
    async with MemlaneClient(stack.api_url, key, session="s1", execution_id="exec-7", invocation=3,
                             agent_version=12) as c:
        stored = await c.add_memory("The on-call rota changes every Monday at 09:00", kind="fact")
        # An HTTP write keeps where it came from, as a turn's tool write does.
        origin = (await c.read_memory(stored["id"])).provenance
        assert (origin.execution_id, origin.invocation, origin.agent_version) == ("exec-7", 3, 12)

        async def searchable():
            hits, _ = await c.search_memory("when does the on-call rota change?")
            return hits and hits[0].record.id == stored["id"]

        await eventually(searchable, timeout=60)
        env = {**stack.env, "MEMLANE_API_URL": stack.api_url, "MEMLANE_SESSION": "s1", "MEMLANE_API_KEY": key,
               "MEMLANE_EXECUTION_ID": "exec-8", "MEMLANE_INVOCATION": "2", "MEMLANE_AGENT_VERSION": "13"}
        memlane = Path(sys.executable).with_name("memlane")  # the console script pyproject.toml installs
        proc = subprocess.Popen([str(memlane), "mcp"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        try:
            rpc = Stdio(proc)
            init = rpc.send("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                           "clientInfo": {"name": "test", "version": "1"}})
            assert init["serverInfo"]["name"] == "memlane" and "tools" in init["capabilities"]
            rpc.send("notifications/initialized", reply=False)
            tools = rpc.send("tools/list")["tools"]
            assert sorted(t["name"] for t in tools) == ["add_memory", "read_memory", "search_memory"]
            found = rpc.tool("search_memory", query="when does the on-call rota change?")
            assert found["records"][0]["id"] == stored["id"]
            assert found["records"][0]["summary"] == "The on-call rota changes every Monday at 09:00"
            written = rpc.tool("add_memory", summary="Incident reviews happen on Fridays")
            [record] = written["memories"]
            assert written["status"] == "applied" and record["summary"] == "Incident reviews happen on Fridays"
        finally:
            proc.kill()
            proc.wait()
        # Written for the key's agent, in MEMLANE_SESSION's session.
        read = await c.read_memory(record["id"])
        assert read.summary == "Incident reviews happen on Fridays" and read.session == "s1"
        assert (read.provenance.execution_id, read.provenance.invocation, read.provenance.agent_version) == (
            "exec-8", 2, 13)
