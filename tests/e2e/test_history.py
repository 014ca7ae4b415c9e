"""Session history end to end: turn events through Kafka -> `memlane worker history`
(Redis) and the API's own history shard (Qdrant Edge) -> POST /v1/history/search.

One small fixture conversation, published once per agent, covers every rule.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from events import AgentConfig, Message, ToolCall, TurnCommitted, TurnRolledBack
from events.codec import decode
from events.rules.history import PART_CHARS
from tests.conftest import eventually

DAY1 = datetime(2026, 9, 18, 10, 0, tzinfo=UTC)
DAY2 = datetime(2026, 9, 19, 9, 30, tzinfo=UTC)
LONG = " ".join(f"paragraph{i} about the migration runbook and its rollback steps" for i in range(90))
assert len(LONG) > 2 * PART_CHARS


def turn(tenant, agent, n, messages, *, session="s1", execution="exec-1", at=DAY1, attempt=1, preview=False):
    return TurnCommitted(
        event_id=str(uuid.uuid4()),
        tenant=tenant,
        agent=agent,
        session=session,
        turn=n,
        attempt=attempt,
        execution_id=execution,
        preview=preview,
        occurred_at=at,
        messages=messages,
    )


def conversation(tenant, agent):
    """The fixture conversation: what each turn said, in the order a platform emits it."""
    m = Message
    failed = turn(tenant, agent, 2, [], attempt=1)
    return [
        turn(tenant, agent, 1, [
            m(id="sys1", role="system", content="You are a release assistant for kestrel"),
            m(id="u1", role="user", content="When is the deployment window for kestrel?"),
            m(id="skill1", role="user", content="skill manual for kestrel deployment", origin="skill_load"),
            m(id="mem1", role="tool", content="memory says kestrel deploys Fridays", origin="retrieval",
              tool_call_id="r1", tool_name="search_memory"),
            m(id="a1", role="assistant", content="Let me check the calendar",
              tool_calls=[ToolCall(id="c1", name="calendar", arguments={"team": "kestrel"})]),
            m(id="t1", role="tool", content="calendar: kestrel window Tuesday 14:00 UTC", tool_call_id="c1",
              tool_name="calendar"),
            m(id="a1b", role="assistant", content="The kestrel window is Tuesday 14:00 UTC"),
        ]),
        # Turn 2 fails once and is retried: only the committed attempt is ever kept.
        TurnRolledBack(**failed.model_dump(exclude={"type", "messages", "status"}), reason="model timeout"),
        turn(tenant, agent, 2, [
            m(id="u2", role="user", content="Also note the giraffe codename for the release"),
            m(id="a2", role="assistant", content="Noted: codename giraffe"),
        ], attempt=2),
        turn(tenant, agent, 3, [
            m(id="u3", role="user", content=LONG),
            m(id="a3", role="assistant", content="I will look up the runbook owner",
              tool_calls=[ToolCall(id="c3", name="lookup_owner", arguments={"doc": "runbook"})]),
            m(id="t3", role="tool", content="lookup_owner failed: owner directory unavailable", tool_call_id="c3",
              tool_name="lookup_owner", is_error=True),
        ], execution="exec-2", at=DAY2),
        turn(tenant, agent, 4, [m(id="u4", role="user", content="preview only: flamingo launch plan")],
             execution="exec-2", at=DAY2, preview=True),
        turn(tenant, agent, 5, [m(id="u5", role="user", content="The kestrel budget is 4200 euros")],
             execution="exec-2", at=DAY2),
    ]


class History:
    """Calls POST /v1/history/search as one agent, in one session and turn."""

    def __init__(self, url, key, session="s1", preview=False, turn=None):
        headers = {"Authorization": f"Bearer {key}"}
        if session:
            headers["X-Session"] = session
        if preview:
            headers["X-Preview"] = "true"
        if turn is not None:
            headers["X-Turn"] = str(turn)
        self.http = httpx.Client(base_url=url, headers=headers, timeout=30)

    def raw(self, **body):
        return self.http.post("/v1/history/search", json=body)

    def __call__(self, query=None, **body):
        r = self.raw(query=query, **body)
        assert r.status_code == 200, r.text
        return r.json()

    def ids(self, query=None, **body):
        return [e["id"] for e in self(query, **body)["events"]]

    def all_pages(self, query=None, **body):
        pages, cursor = [], None
        while True:
            res = self(query, cursor=cursor, **body)
            pages.append([e["id"] for e in res["events"]])
            cursor = res["next_cursor"]
            if not cursor:
                return pages


@pytest.fixture(scope="module")
async def agents(stack, settings):
    """Two agents with the same conversation: one keeps tools, one keeps messages only."""
    from services.client import MemlaneClient, TurnPublisher

    made = {}
    for index in ("messages_and_tools", "messages"):
        tenant, agent = f"ten{uuid.uuid4().hex[:6]}", f"agent{uuid.uuid4().hex[:6]}"
        async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
            key = await op.issue_key(tenant, agent)
            await op.configure(AgentConfig.model_validate({"history": {"index": index}}))
        made[index] = (tenant, agent, key)
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
        for tenant, agent, _ in made.values():
            for ev in conversation(tenant, agent):
                await pub.publish(ev)
    for _, _, key in made.values():
        h = History(stack.api_url, key)
        # Both sides are caught up: the last turn is searchable (Qdrant) and readable (Redis).
        await eventually(lambda h=h: h.ids("kestrel budget euros", mode="lexical")[:1] == ["u5"], timeout=60)
        await eventually(lambda h=h: h.ids(ids=["u5"]) == ["u5"], timeout=60)
    return made


@pytest.fixture
def tools(agents, stack):
    return lambda **kw: History(stack.api_url, agents["messages_and_tools"][2], **kw)


@pytest.fixture
def plain(agents, stack):
    return lambda **kw: History(stack.api_url, agents["messages"][2], **kw)


async def test_only_the_committed_attempt_is_searchable(tools):
    h = tools()
    assert set(h.ids("giraffe codename", mode="lexical")) == {"u2", "a2"}
    [u2] = h(ids=["u2"])["events"]
    assert u2["turn"] == 2 and u2["text"] == "turn 2, user\nAlso note the giraffe codename for the release"


async def test_messages_and_tools_keeps_tool_results_and_errors(tools, plain):
    h = tools()
    res = h("calendar kestrel window", mode="lexical")["events"]
    t1 = next(e for e in res if e["id"] == "t1")
    assert t1["call_id"] == "c1" and t1["tool_name"] == "calendar" and t1["kind"] == "tool_result"
    assert t1["text"].startswith("turn 1, tool calendar\n")
    assert (t1["execution_id"], t1["sequence"]) == ("exec-1", 5)
    [t3] = h(ids=["t3"])["events"]
    assert t3["kind"] == "tool_error" and t3["text"].startswith("turn 3, tool lookup_owner error\n")
    # The reply that called the tool names the call.
    [a1] = h(ids=["a1"])["events"]
    assert a1["calls"] == ["c1"] and "[called calendar" in a1["text"]
    # `messages` finds the same conversation without its tool results and errors.
    p = plain()
    assert "t1" not in p.ids("calendar kestrel window", mode="lexical")
    assert p(ids=["t1", "t3"])["events"] == []
    assert "a1" in p.ids("calendar kestrel window", mode="lexical")


async def test_skill_loads_retrievals_and_system_are_never_kept(tools):
    h = tools()
    found = h.ids("kestrel", mode="lexical", limit=100)
    assert {"u1", "a1b", "u5"} <= set(found)
    assert not {"sys1", "skill1", "mem1"} & set(found)
    assert h(ids=["sys1", "skill1", "mem1"])["events"] == []


async def test_a_long_event_is_kept_in_parts_and_read_whole_by_id(tools):
    h = tools()
    hits = [e for e in h("paragraph85 runbook", mode="lexical", limit=10)["events"] if e["id"] == "u3"]
    assert hits and all(e["parts"] == 3 for e in hits)
    assert {e["part"] for e in hits} <= {1, 2, 3}
    assert any("paragraph85" in e["text"] for e in hits)
    [whole] = h(ids=["u3"])["events"]
    assert whole["part"] is None and whole["parts"] == 3
    assert whole["text"] == "turn 3, user\n" + LONG


async def test_filters_conversation_day_and_range(tools):
    h = tools()
    everything = {"u1", "a1", "t1", "a1b", "u2", "a2", "u3", "a3", "t3", "u5"}
    assert set(h.ids(limit=100)) == everything
    assert set(h.ids(conversation="exec-2", limit=100)) == {"u3", "a3", "t3", "u5"}
    assert set(h.ids(day="2026-09-18", limit=100)) == {"u1", "a1", "t1", "a1b", "u2", "a2"}
    day2 = int(DAY2.timestamp() * 1000)
    assert set(h.ids(since=day2, limit=100)) == {"u3", "a3", "t3", "u5"}
    assert set(h.ids(until=day2, limit=100)) == {"u1", "a1", "t1", "a1b", "u2", "a2"}
    assert h.ids(since=day2 + 1, until=day2 + 2) == []
    # A keyword query with a filter: kestrel is said on both days.
    assert set(h.ids("kestrel", mode="lexical", day="2026-09-19", limit=50)) == {"u5"}
    bad = h.raw(day="19/09/2026")
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "day"
    bad = h.raw(since=10, until=5)
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "until"
    # The request may name what it searches: "messages" here; "notes" the caller's notes (none here).
    assert set(h.ids("kestrel", mode="lexical", kind="messages", day="2026-09-19", limit=20)) == {"u5"}
    notes = h.raw(query="kestrel", kind="notes")
    assert notes.status_code == 200 and notes.json()["notes"] == [] and "events" not in notes.json()


async def test_a_time_the_question_names_ranks_what_was_said_then_first(tools):
    h = tools()
    day1 = {"u1", "a1", "t1", "a1b", "u2", "a2"}  # kestrel is said on both days
    at = {d: int(datetime(2026, 9, d, 12, tzinfo=UTC).timestamp() * 1000) for d in (19, 20)}
    question = "what did we say about kestrel yesterday?"
    assert h.ids(question, now=at[19], limit=1)[0] in day1
    assert h.ids(question, now=at[20], limit=1) == ["u5"]
    assert h.ids("what did we say about kestrel on 18 September, 2026?", now=at[20], limit=1)[0] in day1
    # Days the question does not name change nothing: the same order as without a time.
    assert h.ids("kestrel budget", now=at[20]) == h.ids("kestrel budget")
    # A window the caller gives wins over one the question names.
    assert set(h.ids(question, now=at[20], day="2026-09-18")) <= day1
    bad = h.raw(query=question, now=-1)
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "now"


async def test_paging_to_the_end(tools):
    h = tools()
    pages = h.all_pages(limit=3)
    flat = [i for p in pages for i in p]
    assert [len(p) for p in pages] == [3, 3, 3, 1]
    # Newest first: turn, then the message's place in the turn.
    assert flat == ["u5", "t3", "a3", "u3", "a2", "u2", "a1b", "t1", "a1", "u1"]
    ranked = h.all_pages("kestrel", mode="lexical", limit=2)
    got = [i for p in ranked for i in p]
    assert len(got) == len(set(got)) and {"u1", "a1b", "u5", "t1", "a1"} <= set(got)
    bad = h.raw(cursor=h("kestrel", mode="lexical", limit=1)["next_cursor"])
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "cursor"


async def test_sessions_and_preview_are_isolated(tools, stack, agents):
    assert tools(session="s2").ids("kestrel", mode="lexical") == []
    assert tools(session=None)("kestrel")["events"] == []
    assert tools(session="s2")(ids=["u1"])["events"] == []
    live, preview = tools(), tools(preview=True)
    assert "u4" not in live.ids("flamingo launch", mode="lexical")
    assert live(ids=["u4"])["events"] == []
    assert preview.ids("flamingo launch", mode="lexical")[:1] == ["u4"]


async def test_as_of_turn_search_sees_only_earlier_turns(tools):
    at3 = tools(turn=3)
    assert "u5" not in at3.ids("kestrel budget euros", mode="lexical")
    assert "u3" not in at3.ids("paragraph85 runbook", mode="lexical")
    assert at3(ids=["u5", "u2"])["events"][0]["id"] == "u2" and len(at3(ids=["u5", "u2"])["events"]) == 1
    assert set(at3.ids(limit=100)) == {"u1", "a1", "t1", "a1b", "u2", "a2"}
    # The turn may also come in the body (a replayed turn passes its original turn).
    assert "u5" not in tools().ids("kestrel budget euros", mode="lexical", turn=5)
    assert tools().ids("kestrel budget euros", mode="lexical", turn=6)[:1] == ["u5"]


async def test_hybrid_and_vector_search_rank_by_meaning(tools):
    h = tools()
    assert h.ids("how much money can we spend?", limit=3)[:3].count("u5") == 1
    assert "u5" in h.ids("how much money can we spend?", mode="vector", limit=3)


async def test_history_off_without_harness_history(new_agent, stack):
    _, _, key = await new_agent()
    r = History(stack.api_url, key).raw(query="anything")
    assert r.status_code == 403 and r.json()["error"]["field"] == "harness.history"


async def test_each_search_is_recorded_as_retrieved(tools, settings, agents):
    tenant, agent, _ = agents["messages_and_tools"]
    marker = f"exec-{uuid.uuid4().hex[:8]}"
    h = tools(turn=6)
    h.http.headers["X-Execution-Id"] = marker
    found = h.ids("giraffe", mode="lexical")
    consumer = AIOKafkaConsumer(
        settings.topic("memlane.usage"), bootstrap_servers=settings.kafka_bootstrap,
        auto_offset_reset="earliest", group_id=None,
    )
    await consumer.start()
    seen = []
    try:
        async def recorded():
            for ms in (await consumer.getmany(timeout_ms=500)).values():
                seen.extend(decode("memlane.usage", m.value) for m in ms)
            return [u for u in seen if u.type == "Retrieved" and u.execution_id == marker]

        [u] = await eventually(recorded)
    finally:
        await consumer.stop()
    assert (u.tool, u.tenant, u.agent, u.session, u.turn) == ("search_history", tenant, agent, "s1", 6)
    assert [i.id for i in u.items] == found


async def test_a_members_turns_are_searched_only_by_the_agent_speaking_for_that_member(new_agent, stack, settings):
    # memory.consent is "not_required" (the default): the member's transcript is still theirs.
    from services.client import MemlaneClient, TurnPublisher

    tenant, agent, key = await new_agent(AgentConfig.model_validate({"history": {"index": "messages"}}))
    assert AgentConfig.model_validate({}).memory.consent == "not_required"
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant) as boot:
        operator_key = await boot.issue_key(tenant, None, "operator")
    alice = turn(tenant, agent, 1, [
        Message(id="ua", role="user", content="My locker code is 4411 at the heron gym"),
        Message(id="aa", role="assistant", content="Saved", tool_calls=[
            ToolCall(id="ca", name="add_memory", arguments={"summary": "Alice's heron gym locker code is 4411"})]),
    ], session="sA").model_copy(update={"user": "alice"})
    nobody = turn(tenant, agent, 2, [Message(id="un", role="user", content="The heron gym opens at six")],
                  session="sA")
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
        await pub.publish(alice)
        await pub.publish(nobody)

    def reader(user=None, key=key, **headers):
        h = History(stack.api_url, key, session="sA")
        h.http.headers.update({**({"X-User": user} if user else {}), **headers})
        return h

    as_alice = reader("alice")
    # Both sides are caught up: Qdrant (ranked) and Redis (by id, listing).
    await eventually(lambda: set(as_alice.ids("heron gym locker 4411", mode="lexical")) == {"ua", "aa", "un"},
                     timeout=60)
    await eventually(lambda: set(as_alice.ids(ids=["ua", "aa", "un"])) == {"ua", "aa", "un"}, timeout=60)
    assert set(as_alice.ids(limit=100)) == {"ua", "aa", "un"}
    for name, h in {
        "agent for bob": reader("bob"),
        "agent for no member": reader(),
        "tenant operator": reader(key=operator_key, **{"X-Agent": agent}),
        "tenant operator naming alice": reader("alice", key=operator_key, **{"X-Agent": agent}),
    }.items():
        for found in (h.ids("heron gym locker 4411", mode="lexical"), h.ids("locker code"),
                      h.ids(ids=["ua", "aa", "un"]), h.ids(limit=100)):
            assert found == ["un"], (name, found)


def redis_values(prefix: str) -> list[tuple[str, str]]:
    """(key, each field, member and value) of every key of the deployment's namespace."""
    import redis

    from settings import Settings

    # Bytes, read as text with replacement: some values are binary (the activity view's digests,
    # HyperLogLogs), and a plaintext leak is still found in them.
    s = Settings()
    # On a Redis Cluster the cluster client's scan_iter walks every primary.
    r = redis.RedisCluster.from_url(s.redis_url) if s.redis_cluster else redis.Redis.from_url(s.redis_url)
    out = []
    try:
        for key in r.scan_iter(match=f"ml:{prefix}*", count=10_000):
            kind = r.type(key).decode()
            if kind == "hash":
                got = [x for kv in r.hgetall(key).items() for x in kv]
            elif kind == "zset":
                got = r.zrange(key, 0, -1)
            elif kind == "set":
                got = list(r.smembers(key))
            elif kind == "list":
                got = r.lrange(key, 0, -1)
            else:
                got = [r.get(key)] if kind == "string" else []
            out += [(key.decode(), x.decode("utf-8", "replace")) for x in got]
    finally:
        r.close()
    return out


async def history_vectors(settings) -> dict[str, bytes | None]:
    """The latest value (None: a tombstone) of each part's vector on `memlane.history.vectors`, by point id."""
    from events.topics import HISTORY_VECTORS
    from workers.runtime.topic_reader import TopicReader

    tps = [TopicPartition(settings.topic(HISTORY_VECTORS.name), p) for p in range(HISTORY_VECTORS.partitions)]
    async with TopicReader(settings) as c:
        return {m.key.decode().rpartition("/")[2]: m.value for m in await c.read_all(tps)}


def part_ids(t) -> list[str]:
    from events.rules.history import kept_events, parts_of

    return [pid for e in kept_events(t) for pid, *_ in parts_of(e)]


def files_holding(root, needle: bytes) -> list[str]:
    import os
    from pathlib import Path

    return [str(Path(d, f)) for d, _, files in os.walk(root) for f in files if needle in Path(d, f).read_bytes()]


async def test_history_holds_no_plaintext_and_an_erased_members_history_goes(new_agent, stack, settings):
    """A member's message is sealed in Redis and in the history shard's files (what was not
    sealed, the session id, is there: the data reached them). Once the member is erased on
    the agent, their events go from both sides, and a turn of theirs from before the erasure
    that arrives after it is not kept; another member's and no member's stay."""
    from events import SubjectErased
    from events.topics import EVENTS
    from services.client import TurnPublisher
    from tests.e2e.extraction_support import send_to
    from workers.followers.history_qdrant import history_shard_path

    tenant, agent, key = await new_agent(AgentConfig.model_validate({"history": {"index": "messages"}}))
    canary = f"zq{uuid.uuid4().hex}"
    session = f"sess{uuid.uuid4().hex[:8]}"
    said = [
        turn(tenant, agent, 1, [Message(id="ua", role="user", content=f"My locker code is {canary} at the heron gym")],
             session=session).model_copy(update={"user": "alice"}),
        turn(tenant, agent, 2, [Message(id="ub", role="user", content="Bob swims at the heron gym")],
             session=session).model_copy(update={"user": "bob"}),
        turn(tenant, agent, 3, [Message(id="un", role="user", content="The heron gym opens at six")], session=session),
    ]
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
        for t in said:
            await pub.publish(t)

    def reader(user):
        h = History(stack.api_url, key, session=session)
        if user:
            h.http.headers["X-User"] = user
        return h

    alice, bob, nobody = reader("alice"), reader("bob"), reader(None)
    await eventually(lambda: set(alice.ids("heron gym", mode="lexical")) == {"ua", "un"}, timeout=60)
    await eventually(lambda: set(alice.ids(ids=["ua", "un"])) == {"ua", "un"}, timeout=60)
    assert canary in alice(ids=["ua"])["events"][0]["text"]  # read back opened

    # Redis: the events are there, their texts are not.
    held = redis_values(settings.topic_prefix)
    assert any(agent in k and v == "ua" for k, v in held)
    assert [k for k, v in held if v and canary in v] == []
    # The shard's files, once flushed (every few seconds): its payload's plain keys, no text.
    shard = history_shard_path(settings)
    await eventually(lambda: files_holding(shard, session.encode()), timeout=60)
    assert files_holding(shard, canary.encode()) == []

    erasure = SubjectErased(event_id=str(uuid.uuid4()), command_id=f"erase-{uuid.uuid4().hex[:8]}", tenant=tenant,
                            agent=agent, occurred_at=datetime.now(UTC), user="alice")
    await send_to(settings, EVENTS, erasure)
    await eventually(lambda: alice.ids("heron gym", mode="lexical") == ["un"], timeout=60)
    await eventually(lambda: alice.ids(ids=["ua", "un"]) == ["un"], timeout=60)
    assert alice.ids(limit=100) == ["un"]
    assert set(bob.ids("heron gym", mode="lexical")) == {"ub", "un"} and bob.ids(ids=["ub"]) == ["ub"]
    assert nobody.ids(limit=100) == ["un"]
    assert not any(agent in k and v == "ua" for k, v in redis_values(settings.topic_prefix))
    # The embedding worker tombstones her parts' vectors (sealed under her destroyed key); bob's stay.
    [ua], [ub] = part_ids(said[0]), part_ids(said[1])

    async def alices_vectors_gone():
        vectors = await history_vectors(settings)
        return ua in vectors and vectors[ua] is None and vectors.get(ub) is not None

    await eventually(alices_vectors_gone, timeout=60)

    # A turn of alice's from before the erasure, arriving after it, is not kept nor embedded; a new one is.
    late = turn(tenant, agent, 4, [Message(id="ua-late", role="user", content="heron gym late locker")],
                session=session, at=DAY1).model_copy(update={"user": "alice"})
    fresh = turn(tenant, agent, 5, [Message(id="ua-new", role="user", content="heron gym new locker")],
                 session=session, at=datetime.now(UTC)).model_copy(update={"user": "alice"})
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
        await pub.publish(late)
        await pub.publish(fresh)
    await eventually(lambda: "ua-new" in alice.ids("heron gym locker", mode="lexical"), timeout=60)
    await eventually(lambda: alice.ids(ids=["ua-new"]) == ["ua-new"], timeout=60)
    assert "ua-late" not in alice.ids("heron gym locker", mode="lexical") and alice.ids(ids=["ua-late"]) == []
    # The worker embeds a session's turns in order: the fresh turn's vector came, the late one's never will.
    vectors = await history_vectors(settings)
    assert vectors.get(part_ids(fresh)[0]) is not None and part_ids(late)[0] not in vectors
