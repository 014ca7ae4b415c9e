"""Two members of one agent, their user-scope facts in a real Redis record view and a real
Qdrant Edge index (events applied directly), read through the memory service: search,
listing, read by id (guessed ids too), history and recall never cross members; an operator
reads neither member's facts but counts them; a member reads their own only. And a recall
whose Redis goes away answers empty, flagged, instead of failing the platform's turn."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import structlog.testing
from aiokafka import AIOKafkaConsumer, TopicPartition
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from events import AgentConfigured, ConsentGranted, RecordAdded
from events.codec import PLAIN, decode
from events.config import AgentConfig, member_facts
from events.errors import ErrorCode
from events.record import MemoryRecord, Status
from events.rules.recall_render import FACTS_HEADER
from events.topics import USAGE
from projections.embedders.onnx import OnnxMiniLM
from projections.redis.record_view import RedisRecords
from services.auth import Principal
from services.bootstrap import index_generations
from services.errors import ApiError
from services.memory import Context, MemoryService
from services.memory.kafka import KafkaCommandPublisher, KafkaUsageRecorder
from tests.private_redis import PrivateRedis
from tests.redis_at import redis_at
from workers.followers.memory_shards import MemoryShards
from workers.runtime.kafka_io import ensure_topics, producer

T0 = datetime(2026, 4, 1, tzinfo=UTC)
EMBEDDER = OnnxMiniLM()
USERS = AgentConfig.model_validate({"memory": {"scope": {"read": ["user", "agent"], "write": ["user"]},
                                               "consent": "required", "kinds": ["profile", "fact"]}})


class Subjects:
    """A memory service over a Redis view of its own namespace and Edge shards of its own data dir."""

    def __init__(self, settings, tmp_path, redis_url: str | None = None) -> None:
        self.settings = settings.model_copy(update={"data_dir": tmp_path})
        self.tenant = f"subj{uuid.uuid4().hex[:8]}"
        self.ns = f"{settings.topic_prefix}subj{uuid.uuid4().hex[:6]}."
        self.view = RedisRecords(redis_at(redis_url or settings.redis_url)(pooled=True), namespace=self.ns)
        self.shards = MemoryShards(self.settings, index_generations(self.settings), 1, redis_at(self.settings.redis_url),
                                   codec=PLAIN)
        self.n = 0

    async def __aenter__(self) -> Subjects:
        await ensure_topics(self.settings, [USAGE])
        self.producer = producer(self.settings)
        await self.producer.start()
        publisher = KafkaCommandPublisher(self.settings, self.producer, PLAIN)
        self.service = MemoryService(self.settings, self.view, self.shards, EMBEDDER, publisher,
                                     KafkaUsageRecorder(self.settings, publisher))
        self.reads = self.service.reads
        return self

    async def __aexit__(self, *exc) -> None:
        await self.producer.stop()
        for p in self.shards.projections:
            p.index.close()
        try:
            keys = [k async for k in self.view.r.scan_iter(f"ml:{self.ns}*", count=10_000)]
            if keys:
                await self.view.r.delete(*keys)
        finally:
            await self.view.aclose()

    def _ev(self, cls, **kw):
        self.n += 1
        return cls(event_id=f"e{self.n}", command_id=f"c{self.n}", tenant=self.tenant, agent="a",
                   occurred_at=T0, **kw)

    async def configure(self, cfg: AgentConfig) -> None:
        await self.view.apply([self._ev(AgentConfigured, config=cfg)])

    async def grant(self, *users: str) -> None:
        await self.view.apply([self._ev(ConsentGranted, user=u) for u in users])

    async def put(self, *records: MemoryRecord) -> None:
        """As the two projections apply them: every version to the view, live ones to the index."""
        await self.view.apply([self._ev(RecordAdded, record=r) for r in records])
        live = [r for r in records if r.status is Status.ACTIVE]
        index = self.shards.of(self.tenant, "a").index
        index.upsert(list(zip(live, EMBEDDER.embed([r.text for r in live]))))

    def rec(self, rid, summary, user=None, minute=0, **kw) -> MemoryRecord:
        return MemoryRecord(**{"id": rid, "version": 1, "created": T0 + timedelta(minutes=minute), "modified": T0,
                               "tenant": self.tenant, "agent": "a", "scope": "USER" if user else "AGENT", "user": user,
                               "kind": "profile", "summary": summary, **kw})

    def agent(self, user, role="agent", channel="api") -> Context:
        return Context(Principal(self.tenant, "a", role), "a", session=None, user=user, channel=channel)

    def operator(self, user=None) -> Context:
        return Context(Principal(self.tenant, "a", "operator"), "a", user=user)

    def member(self, user) -> Context:
        return Context(Principal(self.tenant, "a", "member", user=user), "a", user=user)

    async def usage(self) -> list:
        """Every usage record of this tenant on the usage topic so far."""
        topic = self.settings.topic(USAGE.name)
        c = AIOKafkaConsumer(bootstrap_servers=self.settings.kafka_bootstrap, enable_auto_commit=False)
        await c.start()
        try:
            parts = [TopicPartition(topic, p) for p in range(USAGE.partitions)]
            c.assign(parts)
            await c.seek_to_beginning(*parts)
            ends = await c.end_offsets(parts)
            out = []
            while any([await c.position(tp) < ends[tp] for tp in parts]):
                for msgs in (await c.getmany(timeout_ms=1000)).values():
                    out += [u for u in (decode(USAGE.name, m.value) for m in msgs) if u.tenant == self.tenant]
            return out
        finally:
            await c.stop()


async def refused(call) -> ApiError:
    with pytest.raises(ApiError) as e:
        await call
    return e.value


def ids(result) -> set[str]:
    return {r.id for r, _ in result.records}


ANN = {"ann-colour", "ann-diet", "ann-pending", "ann-gone"}
BOB = {"bob-colour", "bob-diet", "bob-conflict"}


async def test_two_members_facts_never_cross_by_any_read(settings, tmp_path):
    async with Subjects(settings, tmp_path) as s:
        await s.configure(USERS)
        await s.grant("ann", "bob")
        await s.put(
            s.rec("ann-colour", "My favourite colour is teal", "ann", 1, key="colour", content="teal"),
            s.rec("ann-diet", "I am vegetarian and avoid fish", "ann", 2, key="diet", content="vegetarian"),
            s.rec("ann-pending", "I might move to Porto next year", "ann", 3, status=Status.PENDING),
            s.rec("ann-gone", "My favourite colour was red", "ann", 4, status=Status.DELETED),
            s.rec("bob-colour", "My favourite colour is crimson", "bob", 5, key="colour", content="crimson"),
            s.rec("bob-diet", "I eat fish every Friday", "bob", 6, key="diet", content="fish on Fridays"),
            s.rec("bob-conflict", "I live in Lisbon", "bob", 7, status=Status.CONFLICT),
            s.rec("shared", "The support desk opens at nine", None, 8, kind="fact"),
        )
        r = s.reads
        everything = sorted(ANN | BOB | {"shared"})
        for me, other in (("ann", BOB), ("bob", ANN)):
            ctx = s.agent(me)
            for mode in ("hybrid", "vector", "lexical"):
                for q in ("what is my favourite colour", "fish diet food", "teal crimson colour"):
                    got = ids(await r.search(ctx, query=q, mode=mode, limit=20))
                    assert got and not got & other, (me, mode, q, got)
            assert not ids(await r.search(ctx, ids=everything)) & other  # guessed ids
            assert not ids(await r.search(ctx)) & other  # the listing search
            listed = {x.id for x in (await r.memories(ctx, 100, None, False)).records}
            assert listed & (ANN if me == "ann" else BOB) and not listed & other
            for rid in other:
                for call in (r.read(ctx, rid), r.history(ctx, rid), r.read(ctx, rid, 1)):
                    e = await refused(call)
                    assert (e.code, e.status, e.message) == (ErrorCode.NOT_FOUND, 404, f"no record {rid} for this agent")
            res = await r.recall(ctx, f"conv-{me}", "what colour do I like and what do I eat")
            assert ids(res) and not ids(res) & other and res.skipped is None and not res.memory_unavailable
            assert ("crimson" in res.rendered) == (me == "bob") and ("teal" in res.rendered) == (me == "ann")
        batch = await r.search_many([(s.agent("ann"), {"query": "favourite colour"}),
                                     (s.agent("bob"), {"query": "favourite colour"})])
        assert "ann-colour" in ids(batch[0]) and not ids(batch[0]) & BOB
        assert "bob-colour" in ids(batch[1]) and not ids(batch[1]) & ANN

        # The operator: no member's fact by any read, but every member's counts.
        op = s.operator()
        assert [x.id for x in (await r.memories(op, 100, None, False)).records] == ["shared"]
        assert ids(await r.search(s.operator("ann"), ids=everything)) == {"shared"}
        assert ids(await r.search(op, query="favourite colour teal crimson", limit=20)) <= {"shared"}
        for rid in ANN | BOB:
            for call in (r.read(op, rid), r.history(op, rid), r.read(s.operator("ann"), rid)):
                assert (await refused(call)).code == ErrorCode.NOT_FOUND
        subjects = await r.subjects(op)
        assert subjects == [{"user": "ann", "facts": 3, "consent": "granted"},
                            {"user": "bob", "facts": 3, "consent": "granted"}]
        assert "teal" not in repr(subjects) and "crimson" not in repr(subjects)

        # A member: their own facts, pending and conflicting ones listed, deleted ones readable.
        ann = s.member("ann")
        assert [x.id for x in (await r.memories(ann, 100, None, False)).records] == \
            ["ann-pending", "ann-diet", "ann-colour"]
        assert [x.id for x in (await r.memories(s.member("bob"), 100, None, True)).records] == \
            ["bob-colour", "bob-diet", "bob-conflict"]
        assert (await r.read(ann, "ann-gone")).status is Status.DELETED
        assert [v.id for v in await r.history(ann, "ann-colour")] == ["ann-colour"]
        for rid in BOB | {"shared"}:
            assert (await refused(r.read(ann, rid))).code == ErrorCode.NOT_FOUND
        for call in (r.search(ann, query="colour"), r.recall(ann, "c", "colour")):
            assert (await refused(call)).code == ErrorCode.FORBIDDEN

        # A member who never granted consent gets an empty recall that says why, and refusals.
        carol = s.agent("carol")
        res = await r.recall(carol, "conv-carol", "favourite colour")
        assert res.records == [] and res.skipped.code == ErrorCode.CONSENT_REQUIRED
        assert (await refused(r.search(carol, query="colour"))).code == ErrorCode.CONSENT_REQUIRED


async def test_the_member_facts_recall_renders_again_and_records_once(settings, tmp_path):
    async with Subjects(settings, tmp_path) as s:
        await s.configure(member_facts())
        await s.grant("ann")
        await s.put(s.rec("ann-colour", "Favourite colour", "ann", 1, key="colour", content="teal"),
                    s.rec("ann-diet", "Diet", "ann", 2, key="diet", content="vegetarian, no fish"),
                    s.rec("bob-colour", "Favourite colour", "bob", 3, key="colour", content="crimson"))
        ctx = s.agent("ann", channel="studio")
        blocks = []
        for _ in range(3):
            res = await s.reads.recall(ctx, "conv", "what colour and food do I like")
            blocks.append(res.rendered)
        assert blocks[0] == blocks[1] == blocks[2]
        lines = blocks[0].split("\n")
        assert "\n".join(lines[:2]) == FACTS_HEADER
        assert sorted(lines[2:]) == ["- colour: teal", "- diet: vegetarian, no fish"]
        # Recorded once, in the conversation's Redis set and on the usage topic.
        key = f"{s.view.root}shown:{s.tenant}/a:conv"
        assert set(await s.view.r.hkeys(key)) == {"ann-colour:1", "ann-diet:1"}
        await s.producer.flush()
        retrieved = [u for u in await s.usage() if u.type == "Retrieved"]
        assert [sorted(i.id for i in u.items) for u in retrieved] == [["ann-colour", "ann-diet"]]
        # A channel that never uses memory: an empty block that says why.
        res = await s.reads.recall(s.agent("ann", channel="slack"), "conv", "colour")
        assert res.rendered == "" and res.skipped.code == ErrorCode.CHANNEL_NOT_ALLOWED


async def test_a_recall_whose_redis_is_down_answers_empty_and_flagged(settings, tmp_path):
    redis = PrivateRedis(tmp_path)
    redis.start()
    try:
        for _ in range(100):
            if redis.ping():
                break
            await asyncio.sleep(0.1)
        async with Subjects(settings, tmp_path / "data", redis.url) as s:
            await s.configure(USERS)
            await s.grant("ann")
            await s.put(s.rec("ann-colour", "My favourite colour is teal", "ann", 1, key="colour", content="teal"))
            ctx = s.agent("ann")
            assert ids(await s.reads.recall(ctx, "conv", "favourite colour")) == {"ann-colour"}
            redis.stop()
            with structlog.testing.capture_logs() as logs:
                res = await s.reads.recall(ctx, "conv2", "what is my favourite colour, ann?")
            assert res.memory_unavailable and res.records == [] and res.pinned == [] and res.skipped is None
            assert "<memory>" in res.rendered and "teal" not in res.rendered
            [event] = [e for e in logs if e["event"] == "recall_memory_unavailable"]
            assert event["tenant"] == s.tenant and event["error"] in ("ConnectionError", "TimeoutError")
            assert "ann" not in repr({k: v for k, v in event.items() if k != "tenant"})
            # Other reads still fail loudly: only recall keeps the platform's turn going.
            with pytest.raises((RedisConnectionError, RedisTimeoutError)):
                await s.reads.search(ctx, query="colour")
            redis.start()
            for _ in range(100):
                if redis.ping():
                    break
                await asyncio.sleep(0.1)
    finally:
        redis.stop()
