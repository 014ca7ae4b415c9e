"""Members, consent and roles through the real stack (API, Kafka, ledger, projections): member
keys, the permissions matrix of member, agent, helper and operator keys, two members of one agent
who never see each other's facts, consent, an operator's counts and erasure, and removal."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from events import AgentConfig, member_facts
from services.client import MemlaneClient, MemlaneError
from tests.conftest import eventually, refused
from tests.e2e.test_mcp_stdio import Stdio

ALL_TOOLS = ["add_memory", "read_memory", "delete_memory", "pin_memory", "unpin_memory", "report_outcome",
             "curate_block"]
# The member-facts preset with every tool offered, pins on, agent-scope records beside the members' (a
# write that names no scope is the member's), and history, so every call has something to refuse.
CONFIG = AgentConfig.model_validate({
    **member_facts(tools=ALL_TOOLS, pinned={"max_tokens": 200},
                   scope={"read": ["user", "agent"], "write": ["user", "agent"]}).model_dump(mode="json"),
    "history": {"index": "messages"}})


class Members:
    """One agent configured with the member-facts preset, its agent and helper keys, the operator, and a member key per user."""

    def __init__(self, api: str, operator_key: str, tenant: str, agent: str) -> None:
        self.api, self.operator_key, self.tenant, self.agent = api, operator_key, tenant, agent
        self.keys: dict[str, str] = {}

    def op(self, **kw) -> MemlaneClient:
        return MemlaneClient(self.api, self.operator_key, tenant=self.tenant, agent=self.agent, **kw)

    def as_agent(self, user: str | None = None, **kw) -> MemlaneClient:
        return MemlaneClient(self.api, self.keys["agent"], user=user, **kw)

    def as_helper(self, user: str | None = None, **kw) -> MemlaneClient:
        return MemlaneClient(self.api, self.keys["helper"], user=user, **kw)

    def as_member(self, user: str, **kw) -> MemlaneClient:
        return MemlaneClient(self.api, self.keys[user], **kw)


@pytest.fixture
def members(stack, settings):
    async def make(*users: str, grant: tuple[str, ...] = (), config=CONFIG) -> Members:
        m = Members(stack.api_url, settings.operator_key, f"ten{uuid.uuid4().hex[:6]}", f"agent{uuid.uuid4().hex[:6]}")
        async with m.op() as op:
            await op.configure(config)
            m.keys["agent"] = await op.issue_key(m.tenant, m.agent)
            m.keys["helper"] = await op.issue_key(m.tenant, m.agent, "helper")
            for u in users:
                m.keys[u] = await op.issue_key(m.tenant, m.agent, "member", user=u)
        for u in grant:
            async with m.as_member(u) as c:
                assert (await c.grant_consent())["consent"] == "granted"
        return m

    return make


def memlane_cli() -> str:
    return str(Path(sys.executable).with_name("memlane"))  # the console script pyproject.toml installs


# --------------------------------------------------------------------------- keys


async def test_a_member_key_names_its_user_and_its_agent_or_every_agent(stack, settings, members):
    m = await members("dana")
    async with MemlaneClient(stack.api_url, settings.operator_key) as boot:
        await refused(boot.issue_key(m.tenant, m.agent, "member"), 422, "VALIDATION_FAILED", "user")
        await refused(boot.issue_key(m.tenant, m.agent, "agent", user="dana"), 422, "VALIDATION_FAILED", "user")
        await refused(boot.issue_key(m.tenant, m.agent, "member", user="dana smith"), 422, "VALIDATION_FAILED",
                      "user")
        every = await boot.issue_key(m.tenant, None, "member", user="dana")
        listed = {k["role"]: k for k in await boot.list_keys(m.tenant) if k["agent"] is None}
        assert listed["member"]["user"] == "dana"
        assert all("user" not in k for k in await boot.list_keys(m.tenant) if k["role"] != "member")
    async with MemlaneClient(stack.api_url, m.keys["dana"]) as own:
        assert (await own.whoami()) | {"key_id": None} == {"tenant": m.tenant, "agent": m.agent, "role": "member",
                                                          "key_id": None, "user": "dana"}
    async with MemlaneClient(stack.api_url, every) as c:
        await refused(c.list_memory(), 422, "VALIDATION_FAILED", "x-agent")  # every agent: name one
    async with MemlaneClient(stack.api_url, every, agent=m.agent) as c:
        assert (await c.list_memory())["records"] == []
        assert (await c.consent())["user"] == "dana"
    for bad in ("not an agent", "a/b", "@workspace"):  # X-Agent is an agent's id wherever it is read
        async with MemlaneClient(stack.api_url, every, agent=bad) as c:
            await refused(c.list_memory(), 422, "VALIDATION_FAILED", "x-agent")
            await refused(c.consent(), 422, "VALIDATION_FAILED", "x-agent")
        async with MemlaneClient(stack.api_url, settings.operator_key, tenant=m.tenant, agent=bad) as op:
            await refused(op.remove_agent(), 422, "VALIDATION_FAILED", "x-agent")
            await refused(op.list_memory(), 422, "VALIDATION_FAILED", "x-agent")
            await refused(op.subjects(), 422, "VALIDATION_FAILED", "x-agent")
    async with MemlaneClient(stack.api_url, m.keys["dana"], agent="someone-else") as c:
        await refused(c.list_memory(), 403, "FORBIDDEN", "x-agent")
    async with MemlaneClient(stack.api_url, m.keys["dana"], user="erin") as c:
        await refused(c.list_memory(), 403, "FORBIDDEN", "x-user")  # a member speaks for itself only


def test_memlane_keys_issues_a_member_key_and_names_the_field_it_refuses(stack, settings):
    tenant = f"ten{uuid.uuid4().hex[:6]}"
    env = {**stack.env, "MEMLANE_API_URL": stack.api_url}
    env.pop("MEMLANE_API_KEY", None)
    ok = subprocess.run([memlane_cli(), "keys", "issue", "--tenant", tenant, "--role", "member", "--user", "dana",
                         "--agent", "bot"], env=env, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    issued = json.loads(ok.stdout)
    assert (issued["role"], issued["user"], issued["agent"]) == ("member", "dana", "bot")
    who = httpx.get(f"{stack.api_url}/v1/whoami", headers={"Authorization": f"Bearer {issued['key']}"}).json()
    assert (who["role"], who["user"]) == ("member", "dana")
    bad = subprocess.run([memlane_cli(), "keys", "issue", "--tenant", tenant, "--role", "member"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "VALIDATION_FAILED (field user)" in bad.stderr, bad.stderr
    listed = subprocess.run([memlane_cli(), "keys", "list", "--tenant", tenant], env=env, capture_output=True,
                            text=True, timeout=60)
    assert listed.returncode == 0 and [k["user"] for k in json.loads(listed.stdout)] == ["dana"]
    assert issued["key"] not in listed.stdout


# --------------------------------------------------------------------------- permissions matrix


async def expect_refused(calls: dict[str, tuple]) -> None:
    """Each call a 4xx with its code naming its field; all checked, the failures listed together."""
    wrong = []
    for name, (coro, status, code, field) in calls.items():
        try:
            await coro
            wrong.append(f"{name}: succeeded")
        except MemlaneError as e:
            if (e.status, e.code, e.field) != (status, code, field) or not 400 <= e.status < 500:
                wrong.append(f"{name}: {e.status} {e.code} field {e.field!r}: {e.message}")
    assert not wrong, "\n".join(wrong)


FORBIDDEN = (403, "FORBIDDEN", "authorization")


async def test_the_permissions_matrix_of_member_agent_helper_and_operator_keys(members):
    m = await members("dana", grant=("dana",))
    async with m.op() as op:  # the agent's own, named for no member: the operator's to read
        shared = await op.add_memory("The office closes at 18:00", kind="semantic", scope="AGENT")
    async with m.as_agent("dana", session="s1", channel="api") as agent:
        fact = await agent.add_memory("Dana's cat is named Miso", kind="profile", key="cat")
        other = await agent.add_memory("Dana takes the 8:15 train", kind="episodic")
        # Written in dana's name, in agent scope: her data, which the operator never reads.
        hers = await agent.add_memory("Dana's team meets on Mondays", kind="semantic", scope="AGENT")
        # The agent: its tools, search, recall, consent read for its member.
        assert [h.record.id for h in (await agent.search_memory("Miso", mode="lexical"))[0]] == [fact["id"]]
        assert "Miso" in (await agent.recall("c1", "what is the cat called?"))["rendered"]
        assert (await agent.read_memory(fact["id"])).user == "dana"
        assert (await agent.consent())["consent"] == "granted"
        await agent.pin(other["id"])
        await agent.unpin(other["id"])
        await agent.curate_block("style", "add", line="Short answers")
        await expect_refused({
            "agent edit": (agent.edit_memory(fact["id"], summary="x"), *FORBIDDEN),
            "agent grant": (agent.grant_consent(), *FORBIDDEN),
            "agent withdraw": (agent.withdraw_consent(), *FORBIDDEN),
            "agent subjects": (agent.subjects(), *FORBIDDEN),
            "agent erase": (agent.erase_subject("dana"), *FORBIDDEN),
            "agent remove agent": (agent.remove_agent(), *FORBIDDEN),
            "agent remove user": (agent.remove_user("dana"), *FORBIDDEN),
            "agent config": (agent.configure(CONFIG), *FORBIDDEN),
            "agent keys": (agent.list_keys(m.tenant), *FORBIDDEN),
            "agent bad x-user": (MemlaneClient(m.api, m.keys["agent"], user="dana smith").list_memory(), 422,
                                 "VALIDATION_FAILED", "x-user"),
            "agent bad x-channel": (MemlaneClient(m.api, m.keys["agent"], channel="a.b").list_memory(), 422,
                                    "VALIDATION_FAILED", "x-channel"),
        })
    async with m.as_helper("dana", session="s1") as helper:
        assert [h.record.id for h in (await helper.search_memory("Miso", mode="lexical"))[0]] == [fact["id"]]
        read_only = (403, "READ_ONLY_KEY", "authorization")
        await expect_refused({
            "helper add": (helper.add_memory("x"), *read_only),
            "helper delete": (helper.delete_memory(fact["id"]), *read_only),
            "helper pin": (helper.pin(fact["id"]), *read_only),
            "helper edit": (helper.edit_memory(fact["id"], summary="x"), *FORBIDDEN),
            "helper consent": (helper.consent(), *FORBIDDEN),
            "helper grant": (helper.grant_consent(), *FORBIDDEN),
            "helper withdraw": (helper.withdraw_consent(), *FORBIDDEN),
            "helper subjects": (helper.subjects(), *FORBIDDEN),
            "helper erase": (helper.erase_subject("dana"), *FORBIDDEN),
            "helper keys": (helper.list_keys(m.tenant), *FORBIDDEN),
        })
    async with m.as_member("dana") as dana:
        # The member: list, read, versions, edit and delete their own facts; consent.
        listed = [r["id"] for r in (await dana.list_memory())["records"]]
        assert sorted(listed) == sorted([fact["id"], other["id"]])  # not the session's record
        assert (await dana.read_memory(fact["id"])).summary == "Dana's cat is named Miso"
        assert [v.version for v in await dana.history(fact["id"])] == [1]
        edited = await dana.edit_memory(fact["id"], summary="Dana's cat is named Miso the Second")
        successor = await dana.read_memory(edited["id"])
        assert (successor.provenance.source.value, successor.provenance.modified_by, successor.user) == (
            "MEMBER", "member:dana", "dana")
        assert (await dana.consent())["consent"] == "granted"
        await dana.delete_memory(other["id"])
        assert (await dana.read_memory(other["id"])).status.value == "DELETED"
        await expect_refused({
            "member search": (dana.search_memory("Miso"), *FORBIDDEN),
            "member batch": (dana._call("POST", "/v1/memory/search/batch",
                                        json={"searches": [{"query": "Miso"}]}), *FORBIDDEN),
            "member recall": (dana.recall("c1", "cat"), *FORBIDDEN),
            "member add": (dana.add_memory("Dana likes tea"), *FORBIDDEN),
            "member pin": (dana.pin(edited["id"]), *FORBIDDEN),
            "member unpin": (dana.unpin(edited["id"]), *FORBIDDEN),
            "member outcome": (dana.report_outcome(edited["id"], True), *FORBIDDEN),
            "member blocks": (dana.blocks(), *FORBIDDEN),
            "member curate": (dana.curate_block("style", "add", line="x"), *FORBIDDEN),
            "member history search": (dana.search_history("train"), *FORBIDDEN),
            "member config": (dana.config(), *FORBIDDEN),
            "member configure": (dana.configure(CONFIG), *FORBIDDEN),
            "member keys": (dana.list_keys(m.tenant), *FORBIDDEN),
            "member issue": (dana.issue_key(m.tenant, m.agent), *FORBIDDEN),
            "member subjects": (dana.subjects(), *FORBIDDEN),
            "member erase": (dana.erase_subject("dana"), *FORBIDDEN),
            "member remove agent": (dana.remove_agent(), *FORBIDDEN),
            "member remove user": (dana.remove_user("dana"), *FORBIDDEN),
            "member agent record": (dana.read_memory(shared["id"]), 404, "NOT_FOUND", "id"),
            "member deletes agent record": (dana.delete_memory(shared["id"]), 404, "NOT_FOUND", "record_id"),
        })
    async with m.op(session="s1") as op:
        # The operator: configuration, keys, counts; never a member's fact.
        assert (await op.config()).memory.consent == "required"
        assert any(k["role"] == "member" for k in await op.list_keys(m.tenant))
        counts = await op.subjects()
        assert counts["subjects"] == [{"user": "dana", "facts": 1, "consent": "granted"}]
        assert "Miso" not in json.dumps(counts)
        assert [r["id"] for r in (await op.list_memory())["records"]] == [shared["id"]]
        not_found = (404, "NOT_FOUND")
        await expect_refused({
            "operator reads a member's fact": (op.read_memory(edited["id"]), *not_found, "id"),
            "operator reads a member's agent-scope record": (op.read_memory(hers["id"]), *not_found, "id"),
            "operator versions of a member's fact": (op.history(edited["id"]), *not_found, "id"),
            "operator edits a member's fact": (op.edit_memory(edited["id"], summary="x"), *not_found, "record_id"),
            "operator deletes a member's fact": (op.delete_memory(edited["id"]), *not_found, "record_id"),
            "operator pins a member's fact": (op.pin(edited["id"]), *not_found, "record_id"),
            "operator grants": (op.grant_consent(), *FORBIDDEN),
            "operator withdraws naming no one": (op.withdraw_consent(), 422, "VALIDATION_FAILED", "x-user"),
            "operator consent naming no one": (op.consent(), 422, "VALIDATION_FAILED", "x-user"),
        })
        found = (await op.search_memory("Miso", mode="lexical"))[0]
        assert found == []
        # An operator never writes a member's memory.
        await refused(op.add_memory("Dana's cat is named Miso", kind="profile", scope="USER"), 403, "FORBIDDEN",
                      "scope")
    async with m.op(user="dana") as op_dana:
        # X-User lets an operator read and change consent, never read or write the member's facts.
        await expect_refused({
            "operator adds naming a member": (op_dana.add_memory("Dana's cat is named Miso", kind="profile"),
                                              403, "FORBIDDEN", "x-user"),
            "operator adds agent-wide naming a member": (op_dana.add_memory("x", kind="semantic", scope="AGENT"),
                                                         403, "FORBIDDEN", "x-user"),
            "operator deletes naming a member": (op_dana.delete_memory(shared["id"]), 403, "FORBIDDEN", "x-user"),
            "operator edits naming a member": (op_dana.edit_memory(shared["id"], summary="x"), 403, "FORBIDDEN",
                                               "x-user"),
            "operator pins naming a member": (op_dana.pin(shared["id"]), 403, "FORBIDDEN", "x-user"),
            "operator curates naming a member": (op_dana.curate_block("style", "add", line="x"), 403, "FORBIDDEN",
                                                 "x-user"),
        })
        assert (await op_dana.consent())["consent"] == "granted"
        assert [r["id"] for r in (await op_dana.list_memory())["records"]] == [shared["id"]]
        await refused(op_dana.read_memory(edited["id"]), 404, "NOT_FOUND", "id")
        assert (await op_dana.search_memory("Miso", mode="lexical"))[0] == []


# --------------------------------------------------------------------------- two members of one agent


async def test_two_members_of_one_agent_never_see_each_others_facts(stack, members):
    m = await members("dana", "erin", grant=("dana", "erin"))
    async with m.as_agent("dana", session="s-dana") as dana_agent, m.as_agent("erin", session="s-erin") as erin_agent:
        cat = await dana_agent.add_memory("Dana's cat is named Miso", kind="profile", key="pet")
        dog = await erin_agent.add_memory("Erin's dog is named Pepper", kind="profile", key="pet")
        assert cat["id"] != dog["id"]  # one key per subject: no conflict between members

        async def searchable():
            hits = (await dana_agent.search_memory("what is the cat called?"))[0]
            return [h.record.id for h in hits] == [cat["id"]]

        await eventually(searchable, timeout=60)
        for mode in ("lexical", "vector", "hybrid"):
            assert [h.record.id for h in (await erin_agent.search_memory("Miso cat", mode=mode))[0]] in (
                [], [dog["id"]]), mode
            assert cat["id"] not in [h.record.id for h in (await erin_agent.search_memory("Dana", mode=mode))[0]]
        assert (await erin_agent.search_memory(None, ids=[cat["id"]]))[0] == []
        assert [r["id"] for r in (await erin_agent.list_memory())["records"]] == [dog["id"]]
        assert [r["id"] for r in (await dana_agent.list_memory())["records"]] == [cat["id"]]
        guessed = [cat["id"], str(uuid.uuid4()), cat["id"][:-1] + ("0" if cat["id"][-1] != "0" else "1")]
        for rid in guessed:
            missing = await refused(erin_agent.read_memory(rid), 404, "NOT_FOUND", "id")
            assert "Miso" not in missing.message
            await refused(erin_agent.history(rid), 404, "NOT_FOUND", "id")
        await refused(erin_agent.delete_memory(cat["id"]), 404, "NOT_FOUND", "record_id")
        assert "Miso" not in (await erin_agent.recall("conv-erin", "what is the cat called?"))["rendered"]
        assert "Pepper" in (await erin_agent.recall("conv-erin", "what is the dog called?"))["rendered"]
        assert "Miso" in (await dana_agent.recall("conv-dana", "what is the cat called?"))["rendered"]
        # A batch names each search's member.
        batch = await dana_agent._call("POST", "/v1/memory/search/batch", json={"searches": [
            {"query": "named", "mode": "lexical", "user": "dana"}, {"query": "named", "mode": "lexical", "user": "erin"},
            {"query": "Miso", "mode": "lexical", "user": "erin"},
            {"query": "Miso", "mode": "lexical", "user": "dana", "channel": "slack"},
            {"query": "Miso", "mode": "lexical", "user": "dana smith"}]})
        assert [[r["id"] for r in res["records"]] for res in batch["results"][:3]] == [[cat["id"]], [dog["id"]], []]
        assert [(e["error"]["code"], e["error"]["field"], e["status"]) for e in batch["results"][3:]] == [
            ("CHANNEL_NOT_ALLOWED", "channel", 403), ("VALIDATION_FAILED", "user", 422)]
    # The extraction worker's lookup (an operator's, `retrieved: false`) reads as the agent for
    # the turn's member; any other operator search never shows a member's fact.
    async with m.op() as op:
        def lookup(retrieved: bool):
            return op._call("POST", "/v1/memory/search/batch", json={"retrieved": retrieved, "searches": [
                {"query": "Miso", "mode": "lexical", "user": "dana"}, {"query": "Miso", "mode": "lexical"}]})

        review = await lookup(False)
        assert [[r["id"] for r in res["records"]] for res in review["results"]] == [[cat["id"]], []]
        plain = await lookup(True)
        assert [[r["id"] for r in res["records"]] for res in plain["results"]] == [[], []]
        # A tenant's admin (an issued operator key) never reads a member's fact, lookup or not.
        admin_key = await op.issue_key(m.tenant, None, "operator")
    async with MemlaneClient(m.api, admin_key, agent=m.agent) as admin:
        looked = await admin._call("POST", "/v1/memory/search/batch", json={"retrieved": False, "searches": [
            {"query": "Miso", "mode": "lexical", "user": "dana"}]})
        assert [r["id"] for r in looked["results"][0]["records"]] == []
    async with m.as_agent() as nobody:
        # Without a member, an agent that requires consent reads nothing.
        await refused(nobody.search_memory("Miso"), 403, "CONSENT_REQUIRED", "user")
    async with m.as_member("erin") as erin, m.as_member("dana") as dana:
        assert [r["id"] for r in (await erin.list_memory())["records"]] == [dog["id"]]
        for rid in guessed:
            await refused(erin.read_memory(rid), 404, "NOT_FOUND", "id")
            await refused(erin.history(rid), 404, "NOT_FOUND", "id")
        await refused(erin.delete_memory(cat["id"]), 404, "NOT_FOUND", "record_id")
        await refused(erin.edit_memory(cat["id"], summary="mine now"), 404, "NOT_FOUND", "record_id")
        assert (await dana.read_memory(cat["id"])).status.value == "ACTIVE"
        assert (await dana.read_memory(cat["id"])).summary == "Dana's cat is named Miso"

    # MCP: the agent's key, with the session's member in MEMLANE_USER.
    def mcp(user: str | None, key: str | None = None) -> subprocess.Popen:
        env = {**stack.env, "MEMLANE_API_URL": stack.api_url, "MEMLANE_API_KEY": key or m.keys["agent"]}
        env.pop("MEMLANE_USER", None)
        if user:
            env["MEMLANE_USER"] = user
        return subprocess.Popen([memlane_cli(), "mcp"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)

    for user, sees, hidden in (("erin", dog["id"], cat["id"]), ("dana", cat["id"], dog["id"])):
        proc = mcp(user)
        try:
            rpc = Stdio(proc)
            rpc.send("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "test", "version": "1"}})
            rpc.send("notifications/initialized", reply=False)
            tools = {t["name"]: t for t in rpc.send("tools/list")["tools"]}
            assert "USER" in json.dumps(tools["add_memory"]["inputSchema"].get("properties", {}).get("scope", {})) \
                or "scope" not in tools["add_memory"]["inputSchema"].get("properties", {})
            listed = rpc.tool("search_memory", mode="lexical", query="named")
            assert [r["id"] for r in listed["records"]] == [sees]
            assert [r["id"] for r in rpc.tool("search_memory")["records"]] == [sees]
            assert rpc.tool("read_memory", id=sees)["sources"][0]["id"] == sees
            denied = rpc.send("tools/call", {"name": "read_memory", "arguments": {"id": hidden}})
            assert denied["isError"] is True and "NOT_FOUND" in denied["content"][0]["text"]
        finally:
            proc.kill()
            proc.wait()
    # A member key is not the agent's: the MCP server refuses it at start.
    proc = mcp(None, m.keys["dana"])
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "member key" in err.decode() and "Traceback" not in err.decode(), err.decode()


# --------------------------------------------------------------------------- consent


async def test_consent_gates_writes_and_recall_and_withdrawal_deletes_nothing(members):
    m = await members("dana")
    async with m.as_agent("dana", session="s1", channel="api") as agent, m.as_member("dana") as dana:
        before = await agent.consent()
        assert (before["required"], before["consent"], before["memory"], before["refusal"]["code"]) == (
            True, None, False, "CONSENT_REQUIRED")
        await refused(agent.add_memory("Dana's cat is named Miso", kind="profile"), 403, "CONSENT_REQUIRED", "user")
        await refused(agent.search_memory("Miso"), 403, "CONSENT_REQUIRED", "user")
        empty = await agent.recall("c1", "what is the cat called?")
        assert empty["skipped"]["code"] == "CONSENT_REQUIRED" and empty["workspaceEntries"] == [] and "Miso" not in \
            empty["rendered"]
        assert (await dana.list_memory())["records"] == []

        granted = await dana.grant_consent()
        assert (granted["status"], granted["consent"], granted["user"]) == ("applied", "granted", "dana")
        assert (await agent.consent())["memory"] is True
        cat = await agent.add_memory("Dana's cat is named Miso", kind="profile", key="cat")
        assert cat["status"] == "applied"
        recalled = await agent.recall("c2", "what is the cat called?")
        assert "skipped" not in recalled and "Miso" in recalled["rendered"]
        # A channel without memory gets none, consent or not.
        async with m.as_agent("dana", channel="slack") as slack:
            await refused(slack.add_memory("Dana's dog is named Pepper"), 403, "CHANNEL_NOT_ALLOWED", "channel")
            assert (await slack.recall("c3", "cat"))["skipped"]["code"] == "CHANNEL_NOT_ALLOWED"

        withdrawn = await dana.withdraw_consent()
        assert withdrawn["consent"] == "withdrawn"
        await refused(agent.add_memory("Dana's dog is named Pepper"), 403, "CONSENT_REQUIRED", "user")
        after = await agent.recall("c4", "what is the cat called?")
        assert after["skipped"]["code"] == "CONSENT_REQUIRED" and "Miso" not in after["rendered"]
        # Withdrawal deletes nothing: the member still lists the fact, and can delete it.
        assert [r["id"] for r in (await dana.list_memory())["records"]] == [cat["id"]]
        assert (await dana.read_memory(cat["id"])).status.value == "ACTIVE"
        await refused(dana.edit_memory(cat["id"], summary="Dana's cat is named Mochi"), 403, "CONSENT_REQUIRED",
                      "user")

        await dana.grant_consent()
        assert "Miso" in (await agent.recall("c5", "what is the cat called?"))["rendered"]
        # An operator withdraws for the member, naming them.
        async with m.op(user="dana") as op:
            assert (await op.withdraw_consent())["consent"] == "withdrawn"
        await refused(agent.add_memory("Dana's dog is named Pepper"), 403, "CONSENT_REQUIRED", "user")
        await dana.delete_memory(cat["id"])
        assert (await dana.list_memory())["records"] == []


# --------------------------------------------------------------------------- operator: counts and erasure


async def test_an_operator_sees_counts_not_bodies_and_erases_a_subject(members):
    m = await members("dana", "erin", grant=("dana", "erin"))
    async with m.as_agent("dana") as dana_agent, m.as_agent("erin") as erin_agent:
        await dana_agent.add_memory("Dana's cat is named Miso", kind="profile")
        await dana_agent.add_memory("Dana is allergic to peanuts", kind="profile")
        pepper = await erin_agent.add_memory("Erin's dog is named Pepper", kind="profile")
    async with m.op() as op:
        raw = (await op.http.get("/v1/subjects")).text
        assert json.loads(raw)["subjects"] == [{"user": "dana", "facts": 2, "consent": "granted"},
                                               {"user": "erin", "facts": 1, "consent": "granted"}]
        assert not any(text in raw for text in ("Miso", "peanuts", "Pepper"))
        listing = (await op.http.get("/v1/memory")).text
        assert not any(text in listing for text in ("Miso", "peanuts", "Pepper"))

        erased = await op.erase_subject("dana")
        assert (erased["status"], erased["user"], erased["erased"]) == ("applied", "dana", 2)
        assert "Miso" not in json.dumps(erased)
        # Erased, dana's rows and consent are purged from the view: only erin is left.
        assert (await op.subjects())["subjects"] == [{"user": "erin", "facts": 1, "consent": "granted"}]
        await refused(op.erase_subject("not a user"), 422, "VALIDATION_FAILED", "user")
    async with m.as_member("dana") as dana, m.as_member("erin") as erin, m.as_agent("dana") as dana_agent:
        assert (await dana.list_memory())["records"] == []
        assert (await dana.consent())["consent"] is None  # purged with the subject: a later write needs a new grant
        await refused(dana_agent.add_memory("Dana's cat is named Miso"), 403, "CONSENT_REQUIRED", "user")
        assert [r["id"] for r in (await erin.list_memory())["records"]] == [pepper["id"]]


# --------------------------------------------------------------------------- removal


async def test_a_removed_member_and_a_removed_agent_are_not_served(stack, settings, members):
    m = await members("dana", "erin", grant=("dana", "erin"))
    async with m.as_agent("dana") as dana_agent, m.as_agent("erin") as erin_agent:
        await dana_agent.add_memory("Dana's cat is named Miso", kind="profile")
        await erin_agent.add_memory("Erin's dog is named Pepper", kind="profile")
    async with MemlaneClient(stack.api_url, settings.operator_key) as boot:
        await refused(boot.remove_user("erin"), 422, "VALIDATION_FAILED", "x-tenant")
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=m.tenant) as op:
        erin_everywhere = await op.issue_key_entry(m.tenant, None, "member", user="erin")
        erin_ids = {k["id"] for k in await op.list_keys(m.tenant) if k.get("user") == "erin"}
        assert len(erin_ids) == 2
        removed = await op.remove_user("erin")
        assert removed["status"] == "applied" and set(removed["revoked_keys"]) == erin_ids
        # The member's keys are revoked with the removal; no other key is.
        assert not any(k.get("user") == "erin" for k in await op.list_keys(m.tenant))
        assert any(k.get("user") == "dana" for k in await op.list_keys(m.tenant))
    for key, agent in ((m.keys["erin"], None), (erin_everywhere["key"], m.agent)):
        async with MemlaneClient(stack.api_url, key, agent=agent) as erin:
            await refused(erin.list_memory(), 401, "UNAUTHENTICATED", "authorization")
            await refused(erin.whoami(), 401, "UNAUTHENTICATED", "authorization")
    async with m.as_agent("erin") as erin_agent, m.as_agent("dana") as dana_agent, m.as_member("dana") as dana:
        await refused(erin_agent.search_memory("Pepper"), 403, "SUBJECT_REMOVED", "user")
        await refused(erin_agent.add_memory("Erin likes tea"), 403, "SUBJECT_REMOVED", "user")
        gone = await erin_agent.recall("c1", "what is the dog called?")
        assert gone["skipped"]["code"] == "SUBJECT_REMOVED" and "Pepper" not in gone["rendered"]
        assert "Miso" in (await dana_agent.recall("c1", "what is the cat called?"))["rendered"]
        assert len((await dana.list_memory())["records"]) == 1

    async with m.op() as op:
        assert (await op.remove_agent())["status"] == "applied"
    async with m.as_agent("dana") as dana_agent, m.as_member("dana") as dana, m.as_helper("dana") as helper:
        await refused(dana_agent.search_memory("Miso"), 403, "SUBJECT_REMOVED", "agent")
        await refused(helper.search_memory("Miso"), 403, "SUBJECT_REMOVED", "agent")
        await refused(dana_agent.add_memory("Dana likes tea"), 403, "SUBJECT_REMOVED", "agent")
        served = await dana_agent.recall("c2", "what is the cat called?")
        assert served["skipped"]["code"] == "SUBJECT_REMOVED" and "Miso" not in served["rendered"]
        await refused(dana.list_memory(), 403, "SUBJECT_REMOVED", "agent")


# --------------------------------------------------------------------------- write answers


async def test_a_reused_command_id_never_answers_with_another_callers_fact(members):
    """A command id already used answers with the first command's events (the ledger's
    redelivery) unless the ledger refuses it (DUPLICATE_ID): either way the answer never
    carries a record its caller could not read."""
    m = await members("alice", "bob", grant=("alice", "bob"))
    command_id = str(uuid.uuid4())
    async with m.as_agent("alice", session="s-alice") as alice:
        first = await alice.add_memory("Alice's locker code is 4411", kind="profile", command_id=command_id)
        assert first["status"] == "applied" and "4411" in json.dumps(first["memories"])
        again = await alice.add_memory("Alice's locker code is 4411", kind="profile", command_id=command_id)
        assert again["id"] == first["id"]  # the same caller sending again gets its own answer
    async with m.op() as op:
        admin_key = await op.issue_key(m.tenant, None, "operator")
    async with m.as_agent("bob", session="s-bob") as bob, MemlaneClient(m.api, admin_key, agent=m.agent) as admin:
        for name, send in (("bob's agent", bob.add_memory("Bob likes jazz", kind="profile", command_id=command_id)),
                           ("a tenant's operator", admin.add_memory("The office closes at 18:00", kind="semantic",
                                                                    scope="AGENT", command_id=command_id))):
            try:
                out = await send
            except MemlaneError as e:
                assert e.code == "DUPLICATE_ID" and "4411" not in e.message, (name, e.code, e.message)
                continue
            assert "4411" not in json.dumps(out) and first["id"] not in json.dumps(out), (name, out)
            assert out["memories"] == [] and "id" not in out and "merged" not in out, (name, out)
    async with m.as_member("alice") as own:
        assert [r["summary"] for r in (await own.list_memory())["records"]] == ["Alice's locker code is 4411"]


# --------------------------------------------------------------------------- history


async def test_history_search_on_a_members_agent_follows_the_subject_rules(members):
    m = await members("dana", "erin", grant=("dana",))
    async with m.as_agent("dana", session="s1", channel="api") as dana_agent:
        assert (await dana_agent.search_history("train"))["events"] == []
    async with m.as_helper("dana", session="s1") as helper:
        assert (await helper.search_history("train"))["events"] == []
    async with m.op(session="s1") as op, m.op(session="s1", user="dana") as op_dana, \
            m.as_agent(session="s1") as nobody, m.as_agent("erin", session="s1") as erin_agent, \
            m.as_agent("dana", session="s1", channel="slack") as slack:
        await expect_refused({
            "operator": (op.search_history("train"), *FORBIDDEN),
            "operator naming the member": (op_dana.search_history("train"), *FORBIDDEN),
            "agent naming no member": (nobody.search_history("train"), 403, "CONSENT_REQUIRED", "user"),
            "agent for a member without consent": (erin_agent.search_history("train"), 403, "CONSENT_REQUIRED",
                                                   "user"),
            "agent in a channel without memory": (slack.search_history("train"), 403, "CHANNEL_NOT_ALLOWED",
                                                  "channel"),
        })
    # An agent that does not require consent: history search as before, an operator's too.
    async with m.op() as op:
        await op.configure(AgentConfig.model_validate({"history": {"index": "messages"}}))
    async with m.op(session="s1") as op, m.as_agent(session="s1") as agent:
        assert (await op.search_history("train"))["events"] == []
        assert (await agent.search_history("train"))["events"] == []


# --------------------------------------------------------------------------- the default kind


async def test_a_members_fact_holds_at_most_4000_characters_whatever_the_agents_setting(members):
    config = AgentConfig.model_validate({"memory": {"scope": {"read": ["user", "agent"], "write": ["user", "agent"]},
                                                    "consent": "required", "fact_chars": 16_000}})
    m = await members("dana", grant=("dana",), config=config)
    async with m.as_agent("dana", session="s1") as agent:
        assert (await agent.add_memory("Dana's reading list", content="b" * 3981))["status"] == "applied"
        e = await refused(agent.add_memory("Dana's reading list", content="b" * 3982), 409, "LIMIT_EXCEEDED",
                          "content")
        assert "4001 characters" in e.message
        # The agent's own memory keeps the agent's setting.
        assert (await agent.add_memory("The reading room", content="b" * 3982, scope="AGENT"))["status"] == "applied"


async def test_an_add_without_a_kind_takes_the_agents_first_declared_kind(stack, members):
    """The member-facts preset declares profile, semantic and episodic, not "fact": a write that
    names no kind is a profile, over HTTP and through the MCP add_memory tool."""
    m = await members("dana", grant=("dana",))
    async with m.as_agent("dana", session="s1") as agent:
        added = await agent.add_memory("Dana's cat is named Miso")
        assert added["status"] == "applied" and (await agent.read_memory(added["id"])).kind == "profile"
        assert (await agent.read_memory((await agent.add_memory("Dana takes the 8:15 train",
                                                                kind="episodic"))["id"])).kind == "episodic"
    env = {**stack.env, "MEMLANE_API_URL": stack.api_url, "MEMLANE_API_KEY": m.keys["agent"], "MEMLANE_USER": "dana"}
    proc = subprocess.Popen([memlane_cli(), "mcp"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        rpc = Stdio(proc)
        rpc.send("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                "clientInfo": {"name": "test", "version": "1"}})
        rpc.send("notifications/initialized", reply=False)
        out = rpc.tool("add_memory", summary="Dana's dog is named Pepper")
        assert out["status"] == "applied" and [r["kind"] for r in out["memories"]] == ["profile"], out
    finally:
        proc.kill()
        proc.wait()


async def test_a_grant_racing_a_withdrawal_is_answered_applied_each_time(members):
    # Each command's answer waits for its own change to be applied: the state read after may
    # be the other command's, and a comparison with it waited out its 6 s into a 504.
    m = await members("alice")
    async with m.as_member("alice") as c:
        for _ in range(20):
            granted, withdrawn = await asyncio.gather(c.grant_consent(), c.withdraw_consent())
            assert (granted["status"], granted["consent"]) == ("applied", "granted"), granted
            assert (withdrawn["status"], withdrawn["consent"]) == ("applied", "withdrawn"), withdrawn


async def test_a_member_removed_from_the_tenant_keeps_their_facts_and_gets_them_back_when_restored(stack, settings,
                                                                                                members):
    """Removing a member from the tenant is not deleting the user: nothing of theirs is erased."""
    m = await members("dana", "erin", grant=("dana", "erin"))
    async with m.as_agent("erin") as erin_agent:
        await erin_agent.add_memory("Erin's dog is named Pepper", kind="profile")
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=m.tenant) as op:
        removed = await op.remove_member("erin")
        assert removed["status"] == "applied" and removed["revoked_keys"]
        assert not any(k.get("user") == "erin" for k in await op.list_keys(m.tenant))
    async with m.as_agent("erin") as erin_agent:
        await refused(erin_agent.search_memory("Pepper"), 403, "SUBJECT_REMOVED", "user")  # not served meanwhile
        gone = await erin_agent.recall("c1", "what is the dog called?")
        assert gone["skipped"]["code"] == "SUBJECT_REMOVED" and "Pepper" not in gone["rendered"]
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=m.tenant) as op:
        assert (await op.restore_user("erin"))["status"] == "applied"
        key = await op.issue_key(m.tenant, m.agent, "member", user="erin")
    async with MemlaneClient(stack.api_url, key) as erin, m.as_agent("erin") as erin_agent:
        assert (await erin.consent())["consent"] == "granted"  # kept: no new grant is asked
        assert [r["summary"] for r in (await erin.list_memory())["records"]] == ["Erin's dog is named Pepper"]
        assert "Pepper" in (await erin_agent.recall("c2", "what is the dog called?"))["rendered"]


async def test_a_removed_member_or_tenant_stays_removed_until_an_operator_restores_it(stack, settings, members):
    m = await members("erin", grant=("erin",))
    async with m.as_agent("erin") as erin_agent:
        await erin_agent.add_memory("Erin's dog is named Pepper", kind="profile")
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=m.tenant) as op:
        await op.remove_user("erin")  # the user deleted: wiped at once, consent included
        # No new key, and so no new consent, for a removed member; their erased consent stays gone.
        await refused(op.issue_key(m.tenant, m.agent, "member", user="erin"), 403, "SUBJECT_REMOVED", "user")
        await refused(op.issue_key(m.tenant, None, "member", user="erin"), 403, "SUBJECT_REMOVED", "user")
        assert (await op.restore_user("erin"))["status"] == "applied"
        await refused(op.restore_user("erin"), 404, "NOT_FOUND", "user")  # restored already
        key = await op.issue_key(m.tenant, m.agent, "member", user="erin")
    async with MemlaneClient(stack.api_url, key) as erin:
        assert (await erin.consent())["consent"] is None  # erased with the removal: asked again
        assert (await erin.grant_consent())["consent"] == "granted"
        assert (await erin.list_memory())["records"] == []  # and their facts are gone

    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=m.tenant) as op:
        assert (await op.http.delete("/v1/tenant")).status_code == 202

        async def refused_in_tenant() -> bool:  # once the view has purged the tenant (it follows the answer)
            try:
                await op.issue_key(m.tenant, m.agent)
            except MemlaneError as e:
                return (e.status, e.code, e.field) == (403, "SUBJECT_REMOVED", "tenant")
            return False

        await eventually(refused_in_tenant, timeout=30)
        for role, user in (("operator", None), ("member", "erin")):
            await refused(op.issue_key(m.tenant, None, role, user=user), 403, "SUBJECT_REMOVED", "tenant")
        assert (await op.restore_tenant())["tenant"] == m.tenant
        key = await op.issue_key(m.tenant, m.agent)
    async with MemlaneClient(stack.api_url, key, user="erin") as agent:
        # Served again, but nothing erased came back: erin's consent is asked again.
        await refused(agent.search_memory("anything"), 403, "CONSENT_REQUIRED", "user")
