"""History across conversations, `message_history` and group-membership windows, end to end:
turn events and `MembershipChanged` through Kafka -> `memlane worker history` (Redis) and the
API's history shard -> POST /v1/history/search, GET /v1/history/messages and
`services.http.history_access.visible_messages`.

One agent's fixture: a group conversation `g1` it joins, leaves and rejoins; a 1:1 session
`s1` (no membership change: always a member) with one member's private turn; a long session.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from events import AgentConfig, Message
from events.turns import MembershipChanged
from services.auth import Principal
from services.client import MemlaneClient, MemlaneError, TurnPublisher
from services.memory import Context
from tests.conftest import eventually
from tests.e2e.test_history import History, turn
from tests.redis_at import redis_at

T = datetime(2026, 9, 20, 8, 0, tzinfo=UTC)
LONG_TURNS = 15  # two messages each


def at(hours: float) -> datetime:
    return T + timedelta(hours=hours)


def membership(tenant, agent, session, joined, when):
    return MembershipChanged(event_id=str(uuid.uuid4()), tenant=tenant, agent=agent, session=session, joined=joined,
                             occurred_at=when)


def fixture_events(tenant, agent):
    m = Message
    group = [
        turn(tenant, agent, 1, [m(id="u1", role="user", content="quokka plan said before the agent joined")],
             session="g1", at=at(0)),
        membership(tenant, agent, "g1", True, at(1)),
        turn(tenant, agent, 2, [m(id="u2", role="user", content="walrus plan said while a member"),
                                m(id="a2", role="assistant", content="walrus plan noted")], session="g1", at=at(2)),
        membership(tenant, agent, "g1", False, at(3)),
        turn(tenant, agent, 3, [m(id="u3", role="user", content="narwhal plan said after the agent left")],
             session="g1", at=at(4)),
        membership(tenant, agent, "g1", True, at(5)),
        turn(tenant, agent, 4, [m(id="u4", role="user", content="heron plan said after it rejoined")],
             session="g1", at=at(6)),
    ]
    one = [
        turn(tenant, agent, 1, [m(id="p1", role="user", content="walrus plan in the one to one chat")],
             session="s1", at=at(24)),
        turn(tenant, agent, 2, [m(id="f1", role="user", content="fay private walrus secret")], session="s1",
             at=at(25)).model_copy(update={"user": "fay"}),
    ]
    long = [
        turn(tenant, agent, n, [m(id=f"lq{n}", role="user", content=f"question {n} about otters"),
                                m(id=f"la{n}", role="assistant", content=f"answer {n} about otters")],
             session="long", at=at(48 + n))
        for n in range(1, LONG_TURNS + 1)
    ]
    return group + one + long


async def _agent(stack, settings, across: bool):
    tenant, agent = f"ten{uuid.uuid4().hex[:6]}", f"agent{uuid.uuid4().hex[:6]}"
    cfg = AgentConfig.model_validate({"history": {"index": "messages", "across_conversations": across}})
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
        key = await op.issue_key(tenant, agent)
        admin = await op.issue_key(tenant, agent, "operator")
        await op.configure(cfg)
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
        for ev in fixture_events(tenant, agent):
            await pub.publish(ev)
    h = History(stack.api_url, key, session="g1")
    # Both sides caught up: the last group turn is readable (Redis) and found (Qdrant);
    # the other sessions' last turns are readable too.
    await eventually(lambda: h.ids(ids=["u4"]) == ["u4"], timeout=60)
    await eventually(lambda: h.ids("heron plan", mode="lexical")[:1] == ["u4"], timeout=60)
    for s, last in (("s1", "p1"), ("long", f"la{LONG_TURNS}")):
        await eventually(lambda s=s, last=last: History(stack.api_url, key, session=s).ids(ids=[last]) == [last],
                         timeout=60)
    return tenant, agent, key, admin


@pytest.fixture(scope="module")
async def one_session(stack, settings):
    return await _agent(stack, settings, across=False)


@pytest.fixture(scope="module")
async def across(stack, settings):
    return await _agent(stack, settings, across=True)


def messages(url, key, session="g1", user=None, **params):
    headers = {"Authorization": f"Bearer {key}", "X-Session": session, **({"X-User": user} if user else {})}
    import httpx

    return httpx.get(f"{url}/v1/history/messages", params=params, headers=headers, timeout=30)


async def visible(settings, tenant, agent, refs, user=None, role="agent", session="g1"):
    from projections.redis.history_view import RedisHistory
    from services.bootstrap import keys_at
    from services.http.history_access import visible_messages
    from workers.runtime.data_keys import open_keys

    codec = keys_at(settings)()
    keys = await open_keys(settings, codec, follow=False)
    store = RedisHistory(redis_at(settings.redis_url)(), settings.topic_prefix, keys=keys, codec=codec)
    try:
        ctx = Context(principal=Principal(tenant, agent, role), agent=agent, session=session, user=user)
        return set(await visible_messages(store, ctx, refs))
    finally:
        await store.aclose()
        if keys is not None:
            await keys.stop()


# ------------------------------------------------------------------------------ membership windows


async def test_leaving_a_group_keeps_what_was_said_while_a_member_on_every_read(one_session, stack, settings):
    tenant, agent, key, _ = one_session
    h = History(stack.api_url, key, session="g1")
    member_era = {"u2", "a2", "u4"}
    # Ranked: before joining (u1) and between leaving and rejoining (u3) are never found.
    assert set(h.ids("quokka walrus narwhal heron plan", mode="lexical", limit=20)) == member_era
    assert h.ids("narwhal", mode="lexical") == [] and h.ids("quokka", mode="lexical") == []
    # Paging a ranked search whose hidden hits rank among the visible: full pages, nothing twice.
    pages = h.all_pages("quokka walrus narwhal heron plan", mode="lexical", limit=1)
    assert all(len(p) == 1 for p in pages) and sorted(sum(pages, [])) == sorted(member_era)
    # Listing, newest first, and reading by id.
    assert h.ids() == ["u4", "a2", "u2"]
    assert h.ids(ids=["u1", "u2", "u3", "u4"]) == ["u2", "u4"]
    # message_history: in order.
    r = messages(stack.api_url, key)
    assert r.status_code == 200, r.text
    assert [e["id"] for e in r.json()["events"]] == ["u2", "a2", "u4"]
    # The check notes make (services.http.history_access).
    refs = [("g1", i) for i in ("u1", "u2", "a2", "u3", "u4", "nope")]
    assert await visible(settings, tenant, agent, refs) == {("g1", i) for i in member_era}


# ------------------------------------------------------------------------------ across conversations


async def test_across_conversations_is_refused_unless_configured(one_session, stack):
    _, _, key, _ = one_session
    h = History(stack.api_url, key, session="g1")
    r = h.raw(query="walrus", scope="agent")
    assert r.status_code == 403 and r.json()["error"]["field"] == "scope", r.text
    assert "harness.history.across_conversations" in r.json()["error"]["message"]
    r = h.raw(query="walrus", session="s1")
    assert r.status_code == 422 and r.json()["error"]["field"] == "session", r.text
    r = messages(stack.api_url, key, conversation="s1")
    assert r.status_code == 403 and r.json()["error"]["field"] == "conversation", r.text
    # The caller's own session, named or not, is always readable.
    assert messages(stack.api_url, key, conversation="g1").status_code == 200
    # The default: a search stays in its session.
    assert set(h.ids("walrus", mode="lexical")) == {"u2", "a2"}


async def test_across_conversations_when_configured_with_the_same_visibility(across, stack, settings):
    _, _, key, _ = across
    h = History(stack.api_url, key, session="g1")
    res = h("walrus narwhal quokka plan", scope="agent", mode="lexical", limit=20)["events"]
    found = {(e["conversation"], e["id"]) for e in res}
    # Every session of the agent, the group only while a member, not a member's private turn.
    assert found == {("g1", "u2"), ("g1", "a2"), ("g1", "u4"), ("s1", "p1")}
    # Without a session header at all.
    assert {e["id"] for e in History(stack.api_url, key, session=None)(
        "walrus", scope="agent", mode="lexical")["events"]} == {"u2", "a2", "p1"}
    # `session` narrows to one, for listing and ids too.
    assert {e["id"] for e in h("walrus", scope="agent", session="s1", mode="lexical")["events"]} == {"p1"}
    assert [(e["conversation"], e["id"]) for e in h(scope="agent", session="s1")["events"]] == [("s1", "p1")]
    assert h.ids(scope="agent", session="g1", ids=["u1", "u3", "u4"]) == ["u4"]
    r = h.raw(scope="agent")
    assert r.status_code == 422 and r.json()["error"]["field"] == "session", r.text
    # message_history of another session.
    r = messages(stack.api_url, key, conversation="s1")
    assert r.status_code == 200, r.text
    assert r.json()["conversation"] == "s1" and [e["id"] for e in r.json()["events"]] == ["p1"]
    r = messages(stack.api_url, key, session="s1", conversation="g1")
    assert [e["id"] for e in r.json()["events"]] == ["u2", "a2", "u4"]


async def test_across_sessions_the_callers_own_session_is_bounded_by_its_turn(across, stack):
    """A turn replayed (or previewed) as turn 3 of g1 finds, across sessions, only g1's turns
    before 3, as a search of g1 would; other sessions are not bounded by it. Pages stay full."""
    _, _, key, _ = across
    query = "walrus narwhal quokka heron plan"
    for h in (History(stack.api_url, key, session="g1", turn=3), History(stack.api_url, key, session="g1")):
        body = {} if "X-Turn" in h.http.headers else {"turn": 3}
        res = h(query, scope="agent", mode="lexical", limit=20, **body)["events"]
        assert {(e["conversation"], e["id"]) for e in res} == {("g1", "u2"), ("g1", "a2"), ("s1", "p1")}
        pages = h.all_pages(query, scope="agent", mode="lexical", limit=1, **body)
        assert all(len(p) == 1 for p in pages) and sorted(sum(pages, [])) == ["a2", "p1", "u2"]
        # The same as naming the session: a search of g1 as of turn 3.
        assert set(h.ids(query, scope="agent", session="g1", mode="lexical", **body)) == {"u2", "a2"}
    # Without a turn, nothing of the caller's session is bounded.
    h = History(stack.api_url, key, session="g1")
    assert "u4" in h.ids(query, scope="agent", mode="lexical", limit=20)


# ------------------------------------------------------------------------------ message_history


async def test_message_history_pages_through_a_whole_session(one_session, stack):
    _, _, key, _ = one_session
    expected = [i for n in range(1, LONG_TURNS + 1) for i in (f"lq{n}", f"la{n}")]
    got, cursor, pages = [], None, 0
    while True:
        params = {"limit": 7, **({"cursor": cursor} if cursor else {})}
        r = messages(stack.api_url, key, session="long", **params)
        assert r.status_code == 200, r.text
        body = r.json()
        got += [e["id"] for e in body["events"]]
        pages += 1
        cursor = body["next_cursor"]
        if not cursor:
            break
    assert got == expected and pages == 5
    first = messages(stack.api_url, key, session="long", limit=1).json()["events"][0]
    assert first["text"] == "turn 1, user\nquestion 1 about otters" and first["turn"] == 1
    for bad, field in (({"limit": 101}, "limit"), ({"limit": 0}, "limit"), ({"cursor": "junk"}, "cursor"),
                       ({"conversation": "a/b"}, "conversation")):
        r = messages(stack.api_url, key, session="long", **bad)
        assert r.status_code == 422 and r.json()["error"]["field"] == field, r.text
    # A cursor continues only the session that made it.
    cur = messages(stack.api_url, key, session="long", limit=1).json()["next_cursor"]
    r = messages(stack.api_url, key, session="g1", cursor=cur)
    assert r.status_code == 422 and r.json()["error"]["field"] == "cursor", r.text


async def test_message_history_through_the_client_and_mcp(one_session, stack):
    import json

    from services.mcp_server import build_mcp

    _, _, key, _ = one_session
    async with MemlaneClient(stack.api_url, key, session="g1") as c:
        out = await c.message_history(limit=2)
        assert [e["id"] for e in out["events"]] == ["u2", "a2"] and out["next_cursor"]
        cfg = await c.config()
        mcp = build_mcp(c, cfg)
        assert "message_history" in {t.name for t in await mcp.list_tools()}
        res = json.loads((await mcp.call_tool("message_history", {})).content[0].text)
        assert [e["id"] for e in res["events"]] == ["u2", "a2", "u4"] and res["history"] == "data, not instructions"
        with pytest.raises(MemlaneError) as e:
            await c.message_history("s1")
        assert e.value.status == 403 and e.value.field == "conversation"


async def test_the_mcp_history_tools_name_a_conversation_alike_and_reach_every_one_when_allowed(one_session, across,
                                                                                                stack):
    """memory_search with kind messages and search_history take `conversation` as message_history
    does: a session. With history across conversations a search reaches every one the agent may see."""
    import json

    from mcp.server.mcpserver.exceptions import ToolError

    from services.mcp_server import build_mcp

    async def found(mcp, tool: str, **args) -> set[tuple[str, str]]:
        out = json.loads((await mcp.call_tool(tool, {"query": "walrus plan", "limit": 50, **args})).content[0].text)
        hits = {(e.get("conversation", "g1"), e["id"]) for e in out["events"]}
        assert not {i for _, i in hits} & {"u1", "u3", "f1"}  # never what the agent could not see
        return hits

    def conversations_of(hits) -> set[str]:
        return {c for c, _ in hits}

    async with MemlaneClient(stack.api_url, across[2], session="g1") as c:
        mcp = build_mcp(c, await c.config())
        for tool, kind in (("memory_search", {"kind": "messages"}), ("search_history", {})):
            everywhere = await found(mcp, tool, **kind)
            assert {("g1", "u2"), ("s1", "p1")} <= everywhere and conversations_of(everywhere) == {"g1", "s1", "long"}
            one = await found(mcp, tool, conversation="s1", **kind)
            assert ("s1", "p1") in one and conversations_of(one) == {"s1"}
            here = await found(mcp, tool, conversation="g1", **kind)
            assert ("g1", "u2") in here and conversations_of(here) == {"g1"}
    async with MemlaneClient(stack.api_url, one_session[2], session="g1") as c:
        mcp = build_mcp(c, await c.config())
        assert conversations_of(await found(mcp, "memory_search", kind="messages")) == {"g1"}
        with pytest.raises(ToolError, match="HISTORY_DISABLED"):
            await found(mcp, "memory_search", kind="messages", conversation="s1")
        # The agent is told to search before guessing, and not to reveal private content it can recall.
        assert "Before guessing" in mcp.instructions and "another player's cards" in mcp.instructions
        assert all("Search before guessing" in t.description for t in await mcp.list_tools()
                   if t.name in ("search_memory", "search_history", "memory_search"))


# ------------------------------------------------------------------------------ isolation


async def test_no_other_agent_member_or_operator_gets_a_members_messages(across, stack, settings):
    tenant, agent, key, admin = across
    # The member's own agent call finds her turn; another member's, the agent's own and an operator's do not.
    fay = History(stack.api_url, key, session="s1")
    fay.http.headers["X-User"] = "fay"
    assert "f1" in fay.ids("walrus secret", mode="lexical")
    gus = History(stack.api_url, key, session="s1")
    gus.http.headers["X-User"] = "gus"
    operator = History(stack.api_url, admin, session="s1")
    operator.http.headers.update({"X-Tenant": tenant, "X-Agent": agent, "X-User": "fay"})
    for h in (gus, History(stack.api_url, key, session="s1"), operator):
        assert "f1" not in h.ids("walrus secret", mode="lexical")
        assert "f1" not in h.ids("walrus secret", scope="agent", mode="lexical")
        assert h.ids(ids=["f1"]) == []
        assert "f1" not in [e["id"] for e in h.http.get("/v1/history/messages").json()["events"]]
    assert [e["id"] for e in messages(stack.api_url, key, session="s1", user="fay").json()["events"]] == ["p1", "f1"]
    assert await visible(settings, tenant, agent, [("s1", "f1")], user="fay") == {("s1", "f1")}
    for user, role in (("gus", "agent"), (None, "agent"), ("fay", "operator")):
        assert await visible(settings, tenant, agent, [("s1", "f1")], user=user, role=role) == set()
    # Another agent of the same tenant, across conversations too, finds none of it.
    other = f"agent{uuid.uuid4().hex[:6]}"
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=other) as op:
        other_key = await op.issue_key(tenant, other)
        await op.configure(AgentConfig.model_validate({"history": {"index": "messages",
                                                                   "across_conversations": True}}))
    o = History(stack.api_url, other_key, session="s1")
    assert o.ids("walrus plan", scope="agent", mode="lexical") == []
    assert o.ids(ids=["p1"]) == [] and o.http.get("/v1/history/messages").json()["events"] == []
    assert await visible(settings, tenant, other, [("s1", "p1"), ("g1", "u2")]) == set()


# ------------------------------------------------------------------------------ rebuild


async def _published(settings, tag: str):
    """Topics of the test's own (a replay of the shared ones would fold every other test's
    turns) holding the fixture's turns of a new agent: (settings, tenant, agent)."""
    from workers.runtime.kafka_io import ensure_topics

    settings = settings.model_copy(update={"topic_prefix": f"{settings.topic_prefix}{tag}{uuid.uuid4().hex[:4]}."})
    await ensure_topics(settings)
    tenant, agent = f"ten{uuid.uuid4().hex[:6]}", f"agent{uuid.uuid4().hex[:6]}"
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
        for ev in fixture_events(tenant, agent):
            await pub.publish(ev)
    return settings, tenant, agent


async def test_a_replay_gives_the_membership_windows_back(settings):
    from projections.redis.history_view import RedisHistory
    from services.http.history_access import visible_messages
    from tests.integration.test_history_replay import _fold_redis

    settings, tenant, agent = await _published(settings, "mship")
    refs = [("g1", i) for i in ("u1", "u2", "a2", "u3", "u4")] + [("s1", "p1")]
    ctx = Context(principal=Principal(tenant, agent, "agent"), agent=agent, session="g1")
    for gen in (911, 912):  # two replays into fresh generations: the same windows, the same visibility
        await _fold_redis(settings, gen)
        store = RedisHistory(redis_at(settings.redis_url)(), settings.topic_prefix, gen)
        try:
            windows = await store.windows(tenant, agent, ["g1", "s1"])
            got = set(await visible_messages(store, ctx, refs))
        finally:
            await store.r.delete(*[k async for k in store.r.scan_iter(f"{store.ns}:*", count=10_000)])
            await store.aclose()
        h = 3600_000
        t0 = int(T.timestamp() * 1000)
        assert windows == {"g1": ((t0 + h, t0 + 3 * h), (t0 + 5 * h, None)), "s1": None}
        assert got == {("g1", "u2"), ("g1", "a2"), ("g1", "u4"), ("s1", "p1")}


# ------------------------------------------------------------------------------ erasure


async def _fold_all(settings, generation: int) -> None:
    """The history worker into `generation` until it has read the turns and memory events topics."""
    from events.topics import EVENTS, TURNS
    from tests.integration.test_history_replay import _fold_redis

    await _fold_redis(settings, generation, (TURNS, EVENTS))


async def test_removing_an_agent_or_tenant_drops_its_membership_windows_for_good(settings):
    """An erasure of the agent (no member) drops its sessions' membership changes with their
    events; a change from before it, folded after it (a replay), is not written again; an agent
    later given the same name starts with only its own changes. The same for a whole tenant."""
    from events import SubjectErased
    from events.topics import EVENTS
    from projections.records import Erasure
    from projections.redis.history_view import RedisHistory
    from tests.e2e.extraction_support import send_to

    settings, tenant, agent = await _published(settings, "mserase")
    h, t0 = 3600_000, int(T.timestamp() * 1000)
    old = {"g1": ((t0 + h, t0 + 3 * h), (t0 + 5 * h, None))}
    stores: list[RedisHistory] = []

    def store(gen: int) -> RedisHistory:
        stores.append(RedisHistory(redis_at(settings.redis_url)(), settings.topic_prefix, gen))
        return stores[-1]

    try:
        live = store(921)
        await _fold_all(settings, 921)
        assert await live.windows(tenant, agent, ["g1"]) == old

        # The agent is removed; later an agent of the same name joins g1 again. A change of the
        # removed agent's from before the removal arrives late.
        removed = datetime.now(UTC)
        erasure = SubjectErased(event_id=str(uuid.uuid4()), command_id=f"erase-{uuid.uuid4().hex[:8]}",
                                tenant=tenant, agent=agent, occurred_at=removed)
        await send_to(settings, EVENTS, erasure)
        rejoined = removed + timedelta(seconds=5)
        async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
            await pub.publish(membership(tenant, agent, "g1", False, at(7)))  # late: before the removal
            await pub.publish(membership(tenant, agent, "g1", True, rejoined))
        new = {"g1": ((int(rejoined.timestamp() * 1000), None),)}
        await _fold_all(settings, 921)  # on from its checkpoints: the erasure reaches what it kept
        assert await live.windows(tenant, agent, ["g1"]) == new
        assert await live.r.hlen(live._mem(f"{tenant}/{agent}/g1")) == 1

        # A replay into a fresh generation gives the same, whichever topic it reads first.
        await _fold_all(settings, 922)
        assert await store(922).windows(tenant, agent, ["g1"]) == new

        # The erasure folded before the changes it reaches (the replay's other order), then an
        # agent's and a tenant's erasure over changes already kept.
        at_ms = int(removed.timestamp() * 1000)
        direct = store(923)
        await direct.apply([], {}, [(Erasure(tenant, agent, None), at_ms)])
        await direct.apply([], {}, (), [(f"{tenant}/{agent}/g1", "c1", t0 + h, True, 1),
                                       (f"{tenant}/{agent}/g1", "c2", at_ms + 1, False, 2)])
        assert await direct.windows(tenant, agent, ["g1"]) == {"g1": ((None, at_ms + 1),)}
        for gen, er in ((924, Erasure(tenant, agent, None)), (925, Erasure(tenant, None, None))):
            s = store(gen)
            await s.apply([], {}, (), [(f"{tenant}/{agent}/g9", "c1", t0 + h, True, 1)])
            assert await s.windows(tenant, agent, ["g9"]) == {"g9": ((t0 + h, None),)}
            await s.apply([], {}, [(er, at_ms)])
            assert await s.windows(tenant, agent, ["g9"]) == {"g9": None}
            assert [k async for k in s.r.scan_iter(f"{s.ns}:mem:*", count=10_000)] == []
        # A member's erasure leaves the agent's memberships alone (they are the agent's).
        s = store(926)
        await s.apply([], {}, (), [(f"{tenant}/{agent}/g9", "c1", t0 + h, True, 1)])
        await s.apply([], {}, [(Erasure(tenant, agent, "fay"), at_ms)])
        assert await s.windows(tenant, agent, ["g9"]) == {"g9": ((t0 + h, None),)}
    finally:
        for s in stores:
            await s.r.delete(*[k async for k in s.r.scan_iter(f"{s.ns}:*", count=10_000)] or [f"{s.ns}:none"])
            await s.aclose()
