"""AGENT_MEMORY_KILL_SWITCH: one setting turns memory off for every agent."""

from __future__ import annotations

import signal
import uuid

import pytest

from events import AgentConfig, Message, ToolCall
from events.topics import COMMANDS
from services.client import MemlaneClient, TurnPublisher
from services.stack import Stack, free_port
from tests.conftest import eventually, refused
from tests.e2e.extraction_support import new_agent, read_topic, turn
from tests.fakes.model_server import Reply


@pytest.fixture(scope="module")
def kstack(model_stack, tmp_path_factory):
    """The model stack with memory switched off: an API replica of its own (same topics and
    Redis, its own data directory and port) and its extraction worker replaced by one with the
    switch set, put back afterwards. The model stack's tests run one at a time in one process,
    so no other test's turn meets the switched-off worker."""
    stack, settings = model_stack
    data = tmp_path_factory.mktemp("kill-switch")
    port = free_port()
    off = Stack({**stack.env, "MEMLANE_DATA_DIR": str(data), "MEMLANE_API_PORT": str(port),
                 "MEMLANE_METRICS_PORT": "0", "AGENT_MEMORY_KILL_SWITCH": "on"}, data / "logs")
    stack.kill("extraction", signal.SIGTERM)
    try:
        off.start_all(workers=("extraction",))
        yield off, settings.model_copy(update={"data_dir": data, "api_port": port})
    finally:
        off.stop()
        stack.start("extraction")


async def test_the_kill_switch_refuses_calls_recalls_nothing_and_extracts_nothing(kstack, fake):
    stack, settings = kstack
    tools = AgentConfig.model_validate({"memory": {"tools": ["add_memory", "read_memory"], "pinned": {"max_tokens": 400}}})
    tenant, agent, key = await new_agent(stack.api_url, settings.operator_key, tools)
    # What recall would show with memory on: an operator's pinned record and a block.
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent, session="s1") as op:
        await op.add_memory("The release train leaves on Thursdays", kind="fact", pinned=True)
        await op.curate_block("conventions", "add", line="Deploys go out on Tuesdays")

        async def listed():
            return [f.record for f in (await op.search_memory(None))[0]]

        [planted] = await eventually(listed)
        assert planted.pinned and (await op.blocks())[0]["text"] == "Deploys go out on Tuesdays"
    async with MemlaneClient(stack.api_url, key, session="s1") as c:
        for call in (c.search_memory("anything"), c.add_memory("a fact"), c.search_history("anything"),
                     c.message_history()):
            await refused(call, 403, "MEMORY_DISABLED", "AGENT_MEMORY_KILL_SWITCH")
        recalled = await c.recall("conv-1", "when does the release train leave?")
        assert recalled["pinned"] == recalled["workspaceEntries"] == recalled["blocks"] == []
        assert "Thursdays" not in recalled["rendered"] and "Tuesdays" not in recalled["rendered"]
    # A committed turn with an add_memory call, and a model that would propose a record:
    # the outcome is forwarded, and neither the call nor a review becomes a command.
    marker = f"kill-{uuid.uuid4().hex[:8]}"
    fake.on(marker, Reply({"candidates": [{"decision": "add", "handle": None, "kind": "fact", "labels": {},
                                           "scope": "session", "summary": f"reviewed {marker}", "content": "",
                                           "source_message_ids": []}]}))
    t = turn(tenant, agent, "s1", 1, messages=[
        Message(id="m1", role="user", content=f"Remember {marker}"),
        Message(id="m2", role="assistant", content="", tool_calls=[
            ToolCall(id="c1", name="add_memory", arguments={"summary": f"tool {marker}"})]),
    ])
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
        await pub.publish(t)

    async def commands():
        mine = [c for c, _ in await read_topic(settings, COMMANDS.name, COMMANDS.name)
                if (c.tenant, c.agent, c.turn_ref) == (tenant, agent, t.turn_ref)]  # the stack's other turns share refs
        return mine if any(c.type == "TurnOutcome" for c in mine) else None

    # A turn's writes and its outcome commit in one transaction: once the outcome is
    # readable, anything the turn caused would be too.
    assert [c.type for c in await eventually(commands)] == ["TurnOutcome"]
    assert not [r for r in fake.requests if marker in str(r)]
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent, session="s1") as op:
        # Operators still list: the planted record, and nothing the turn caused.
        assert [f.record.id for f in (await op.search_memory(None))[0]] == [planted.id]
