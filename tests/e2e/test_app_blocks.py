"""Application-scoped blocks through the running stack (docs/features/recall.md): curated over
HTTP and MCP beside the agent's and the workspace's, recalled and listed only for their
application, in a fixed order, and given back by a rebuild."""

from __future__ import annotations

import json

from events import AgentConfig
from projections.redis.record_view import RedisRecords
from services.client import MemlaneClient
from services.mcp_server import build_mcp
from tests.e2e.rebuild_support import rebuilt_redis
from tests.redis_at import redis_at

CFG = AgentConfig.model_validate({"memory": {"tools": ["add_memory", "curate_block"]}})


def labels(blocks: list[dict]) -> list[tuple]:
    return [(b["scope"], b["label"], b.get("application"), b["text"]) for b in blocks]


async def test_application_blocks_are_recalled_only_for_their_application_and_survive_a_rebuild(
        stack, new_agent, settings):
    tenant, agent, key = await new_agent(CFG)
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op, \
            MemlaneClient(stack.api_url, key, session="s1") as c:
        await op.curate_block("tone", "add", line="Polite", scope="workspace")
        await op.curate_block("tone", "add", line="Formal", scope="workspace", application="billing")
        await c.curate_block("stack", "add", line="Python")
        out = await c.curate_block("refunds", "add", line="Never promise refunds", application="billing")
        assert out["block"] == {"label": "refunds", "text": "Never promise refunds", "application": "billing"}
        mcp = build_mcp(c, CFG)
        made = json.loads((await mcp.call_tool("curate_block", {"label": "emoji", "action": "add", "line": "Use emoji",
                                                                "application": "chat"})).content[0].text)
        assert made["block"]["application"] == "chat"
        # The same label for the agent and for an application: two blocks.
        await c.curate_block("stack", "add", line="Stripe SDK", application="billing")

        billing = [("workspace", "tone", None, "Polite"), ("workspace", "tone", "billing", "Formal"),
                   ("agent", "stack", None, "Python"), ("agent", "refunds", "billing", "Never promise refunds"),
                   ("agent", "stack", "billing", "Stripe SDK")]
        assert labels(await c.blocks(application="billing")) == billing
        assert labels(await c.blocks()) == [("workspace", "tone", None, "Polite"), ("agent", "stack", None, "Python")]
        recalled = await c.recall("conv-1", "can I get a refund?", application="billing")
        assert labels(recalled["blocks"]) == billing
        text = recalled["rendered"]
        assert text.index("### tone (workspace)\n") < text.index("### tone (workspace, billing)\n") \
            < text.index("### stack\n") < text.index("### refunds (billing)\n") < text.index("### stack (billing)\n")
        assert "Use emoji" not in text  # another application's never
        chat = await c.recall("conv-2", "hello", application="chat")
        assert labels(chat["blocks"]) == [("workspace", "tone", None, "Polite"), ("agent", "stack", None, "Python"),
                                          ("agent", "emoji", "chat", "Use emoji")]
        assert "Never promise refunds" not in chat["rendered"] and "Formal" not in chat["rendered"]
        plain = await c.recall("conv-3", "hello")
        assert labels(plain["blocks"]) == [("workspace", "tone", None, "Polite"), ("agent", "stack", None, "Python")]
        # A bad application is refused naming the field; emptied, an application's block goes.
        r = await c.http.post("/v1/blocks/x", params={"application": "bad:app"}, json={"action": "add", "line": "y"})
        assert r.status_code == 422 and "application" in r.text
        await c.curate_block("emoji", "remove", old="Use emoji", application="chat")
        assert labels(await c.blocks(application="chat")) == labels(await c.blocks())

    # A rebuild fills a new generation from the log alone: the same blocks, kept apart.
    store = RedisRecords(redis_at(settings.redis_url)(pooled=True), namespace=settings.topic_prefix)
    try:
        fields = await store.r.hkeys(f"{store._ns(await rebuilt_redis(stack, store))}:blocks:{{{tenant}/{agent}}}")
        assert sorted(f.decode() if isinstance(f, bytes) else f for f in fields) == [
            "billing:refunds", "billing:stack", "stack"]
    finally:
        await store.aclose()
    async with MemlaneClient(stack.api_url, key) as c:
        assert labels(await c.blocks(application="billing")) == billing
