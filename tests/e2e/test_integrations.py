"""The framework adapters of the client package against the shared stack, with the real libraries:
LangGraph's long-term store, and LangChain's retriever and chat message history."""

from __future__ import annotations

import asyncio

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
