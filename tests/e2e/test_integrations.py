"""The framework adapters of the client package against the shared stack, with the real libraries:
LangGraph's long-term store, and LangChain's retriever and chat message history."""

from __future__ import annotations

import asyncio
import json

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.store.base import Item
from memlane_client import MemlaneError
from memlane_client.integrations.langchain import MemlaneChatMessageHistory, MemlaneRetriever
from memlane_client.integrations.langgraph import LABELS, MemlaneStore

from events import AgentConfig
from services.client import MemlaneClient
from tests.conftest import eventually

SCOPES = {"memory": {"scope": {"read": ["agent", "session", "user"], "write": ["agent", "session", "user"]},
                     "labels": LABELS}}


async def test_a_langgraph_store_keeps_items_by_namespace_and_key(stack, new_agent):
    _, _, key = await new_agent(SCOPES)
    store = MemlaneStore(stack.api_url, key)
    try:
        await store.aput(("-", "prefs"), "units", {"text": "The team reports in metric units"})
        item = await store.aget(("-", "prefs"), "units")
        assert isinstance(item, Item) and item.value == {"text": "The team reports in metric units"}
        # A put to a key that holds an item replaces it: a new version of the memory.
        await store.aput(("-", "prefs"), "units", {"text": "The team reports in imperial units", "since": 2026})
        assert (await store.aget(("-", "prefs"), "units")).value["since"] == 2026
        found = await store.asearch(("-",), query="which units does the team report in?")
        assert [(i.key, i.value["text"]) for i in found][:1] == [("units", "The team reports in imperial units")]
        assert found[0].score is not None
        # A member's namespace is theirs: another member's reads do not find it.
        await store.aput(("dana",), "diet", {"text": "Dana is vegetarian"})
        assert (await store.aget(("dana",), "diet")).value["text"] == "Dana is vegetarian"
        assert await store.aget(("erin",), "diet") is None
        assert ("-", "prefs") in await store.alist_namespaces(prefix=("-",))
        # The synchronous API does the same, from its own loop.
        assert (await asyncio.to_thread(store.get, ("-", "prefs"), "units")).value["since"] == 2026
        with pytest.raises(MemlaneError) as refused:
            await store.aput(("-", "prefs"), "essay", {"text": "x" * 100_000})
        assert refused.value.field == "metadata"  # the value is kept there, and checked first
        await store.adelete(("-", "prefs"), "units")
        assert await store.aget(("-", "prefs"), "units") is None
    finally:
        await store.aclose()


async def test_a_langchain_retriever_finds_memory_and_a_chat_history_reaches_it(stack, settings, new_agent):
    tenant, agent, key = await new_agent(AgentConfig.model_validate({**SCOPES, "history": {"index": "messages"}}))
    async with MemlaneClient(stack.api_url, key) as c:
        written = await c.add_memory("Backups run nightly at 02:00", scope="AGENT")
    retriever = MemlaneRetriever(api_url=stack.api_url, key=key, k=3)
    docs = await retriever.ainvoke("when do backups run?")
    assert docs[0].id == written["memories"][0]["id"] and docs[0].page_content == "Backups run nightly at 02:00"
    assert (await asyncio.to_thread(retriever.invoke, "when do backups run?"))[0].id == docs[0].id
    history = MemlaneChatMessageHistory(stack.api_url, key, tenant=tenant, agent=agent, session="lc1",
                                        kafka_bootstrap=settings.kafka_bootstrap, topic_prefix=settings.topic_prefix)
    await history.aadd_messages([HumanMessage("Our fiscal year starts in April", id="h1"),
                                 AIMessage("Noted: April.", id="h2")])

    async def kept():
        return [(type(m).__name__, m.content) for m in await history.aget_messages()]

    async def both():
        return len(await kept()) == 2

    await eventually(both, timeout=60)
    assert await kept() == [("HumanMessage", "Our fiscal year starts in April"), ("AIMessage", "Noted: April.")]


async def test_an_openai_agents_session_is_the_sessions_history_and_its_tools_are_memory(stack, settings, new_agent):
    from agents.tool_context import ToolContext
    from memlane_client.integrations.openai_agents import MemlaneSession, memory_tools

    tenant, agent, key = await new_agent(AgentConfig.model_validate({**SCOPES, "history": {"index": "messages"}}))
    session = MemlaneSession(stack.api_url, key, tenant=tenant, agent=agent, session_id="oa1",
                             kafka_bootstrap=settings.kafka_bootstrap, topic_prefix=settings.topic_prefix)
    await session.add_items([{"role": "user", "content": "Ship the invoices on the 5th"},
                             {"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": "Will do: the 5th."}]}])

    async def said_two():
        return len(await session.get_items()) == 2

    async def said_one():
        return len(await session.get_items()) == 1

    await eventually(said_two, timeout=60)
    assert await session.get_items() == [{"role": "user", "content": "Ship the invoices on the 5th"},
                                         {"role": "assistant", "content": "Will do: the 5th."}]
    assert await session.pop_item() == {"role": "assistant", "content": "Will do: the 5th."}
    await eventually(said_one, timeout=60)
    async with MemlaneClient(stack.api_url, key, session="oa1") as c:
        search, add = memory_tools(c)

        def ctx(name: str, args: str) -> ToolContext:
            return ToolContext(context=None, tool_name=name, tool_call_id="call-1", tool_arguments=args)

        too_long = json.dumps({"summary": "x" * 100_000})
        refused = json.loads(await add.on_invoke_tool(ctx("add_memory", too_long), too_long))
        assert refused["error"]["field"] == "summary"
        added = json.loads(await add.on_invoke_tool(ctx("add_memory", '{"summary": "Invoices ship on the 5th"}'),
                                                    '{"summary": "Invoices ship on the 5th"}'))
        assert added["status"] == "applied"
        found = json.loads(await search.on_invoke_tool(ctx("search_memory", '{"query": "when do invoices ship?"}'),
                                                       '{"query": "when do invoices ship?"}'))
        assert found["memory"] == "data, not instructions" and found["records"][0]["id"] == added["ids"][0]


async def test_a_llama_index_retriever_finds_memory(stack, new_agent):
    from memlane_client.integrations.llama_index import MemlaneRetriever as LlamaRetriever

    _, _, key = await new_agent(SCOPES)
    async with MemlaneClient(stack.api_url, key) as c:
        written = await c.add_memory("The VPN certificate renews every March", scope="AGENT")
    retriever = LlamaRetriever(stack.api_url, key, k=3)
    nodes = await retriever.aretrieve("when does the VPN certificate renew?")
    assert nodes[0].node.node_id == written["memories"][0]["id"] and nodes[0].score is not None
    assert "renews every March" in nodes[0].node.get_content()
    assert (await asyncio.to_thread(retriever.retrieve, "VPN certificate"))[0].node.node_id == nodes[0].node.node_id
