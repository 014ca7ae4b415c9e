"""The walking skeleton, through real processes: turn event -> extraction worker ->
ledger -> projections (Redis, Qdrant Edge) -> HTTP search."""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import UTC, datetime
from functools import partial

import httpx
from aiokafka import AIOKafkaConsumer

from events import Message, ToolCall, TurnCommitted, TurnRolledBack
from services.client import MemlaneClient
from tests.conftest import eventually


def committed_turn(tenant, agent, session, n, summary, **kw):
    return TurnCommitted(
        event_id=str(uuid.uuid4()),
        tenant=tenant,
        agent=agent,
        session=session,
        turn=n,
        execution_id="exec-1",
        invocation=2,
        agent_version=5,
        occurred_at=datetime.now(UTC),
        messages=[
            Message(id=f"u{n}", role="user", content="remember this please"),
            Message(
                id=f"a{n}",
                role="assistant",
                tool_calls=[ToolCall(id=f"c{n}", name="add_memory", arguments={"summary": summary, "kind": "fact"})],
            ),
        ],
        **kw,
    )


async def test_turn_event_becomes_a_searchable_record_with_provenance(stack, publisher, new_agent):
    tenant, agent, key = await new_agent()
    await publisher.publish(committed_turn(tenant, agent, "s1", 7, "The deploy window is Tuesday 14:00 UTC"))
    async with MemlaneClient(stack.api_url, key, session="s1") as c:

        async def found():
            hits, _ = await c.search_memory("when can we deploy?")
            return hits

        hits = await eventually(found)
        r = hits[0].record
        assert r.summary == "The deploy window is Tuesday 14:00 UTC"
        assert (r.tenant, r.agent, r.session) == (tenant, agent, "s1")
        assert (r.provenance.turn, r.provenance.execution_id, r.provenance.invocation) == (7, "exec-1", 2)
        assert r.provenance.agent_version == 5 and r.provenance.source.value == "TOOL"
        assert r.provenance.source_message_ids == ["a7"]
        # Another session of the same agent does not see a session-scoped record.
    async with MemlaneClient(stack.api_url, key, session="s2") as other:
        hits, _ = await other.search_memory("when can we deploy?")
        assert hits == []


async def test_rolled_back_turn_leaves_no_record(stack, publisher, new_agent):
    tenant, agent, key = await new_agent()
    rolled = committed_turn(tenant, agent, "s1", 1, "Rolled back fact about zebras")
    # The same turn attempt is rolled back instead of committed: its write must vanish.
    await publisher.publish(
        TurnRolledBack(**rolled.model_dump(exclude={"type", "messages", "status"}), reason="model error")
    )
    await publisher.publish(committed_turn(tenant, agent, "s1", 2, "Committed fact about giraffes"))
    async with MemlaneClient(stack.api_url, key, session="s1") as c:

        async def listed():
            found, _ = await c.search_memory(None, limit=10)
            return found

        found = await eventually(listed)
        assert [f.record.summary for f in found] == ["Committed fact about giraffes"]
        hits, _ = await c.search_memory("zebras", mode="lexical")
        assert hits == []


async def test_poison_turn_goes_to_the_dlq_and_the_worker_keeps_going(stack, settings, publisher, new_agent):
    tenant, agent, key = await new_agent()
    topic = settings.topic("memlane.turns")
    await publisher.producer.send_and_wait(topic, b'{"type": "TurnCommitted", "tenant": 1}', key=b"poison")
    await publisher.publish(committed_turn(tenant, agent, "s1", 1, "Fact after the poison pill"))

    consumer = AIOKafkaConsumer(
        f"{topic}.dlq", bootstrap_servers=settings.kafka_bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    try:
        async def dead_letter():
            batch = await consumer.getmany(timeout_ms=500)
            return [m for ms in batch.values() for m in ms if m.key == b"poison"]

        # Every consumer group of the topic parks the message it cannot read, and so does every
        # fold the API runs over it.
        for dead in await eventually(dead_letter):
            headers = {k: v.decode() for k, v in dead.headers}
            assert headers["source_topic"] == topic
            assert headers["source_offset"].isdigit() and headers["source_partition"].isdigit()
            assert "event_id" in headers["error"] or "tenant" in headers["error"]
            assert headers["attempt"] == "1"
            assert headers["consumer_group"].endswith(("extraction", "consolidation", "history", "embedding",
                                                       "activity", "history-index"))
    finally:
        await consumer.stop()
    async with MemlaneClient(stack.api_url, key, session="s1") as c:

        async def found():
            hits, _ = await c.search_memory("poison pill")
            return hits

        assert (await eventually(found))[0].record.summary == "Fact after the poison pill"


async def test_poison_event_goes_to_the_dlq_and_the_redis_projection_keeps_going(stack, settings, publisher, new_agent):
    """The projections read lean views of events; what they refuse still goes to the DLQ."""
    tenant, agent, key = await new_agent()
    topic = settings.topic("memlane.memory.events")
    await publisher.producer.send_and_wait(topic, b'{"type": "RecordAdded", "command_id": "c"}', key=b"poison-event")
    consumer = AIOKafkaConsumer(
        f"{topic}.dlq", bootstrap_servers=settings.kafka_bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    try:
        parked: dict[str, dict[str, str]] = {}  # consumer group -> headers

        async def parked_by_the_projection():
            for ms in (await consumer.getmany(timeout_ms=500)).values():
                for m in ms:
                    if m.key == b"poison-event":
                        headers = {k: v.decode() for k, v in m.headers}
                        parked[headers["consumer_group"].rsplit(".", 1)[-1]] = headers
            return parked.get("redis-projection") and parked.get("memory-index")

        await eventually(parked_by_the_projection)
        # The worker that folds events into Redis, and the API's follower that folds them into
        # the memory index: each parks what it cannot fold, and says so.
        for group in ("redis-projection", "memory-index"):
            assert parked[group]["source_topic"] == topic and "record" in parked[group]["error"], parked
    finally:
        await consumer.stop()
    async with MemlaneClient(stack.api_url, key, session="s1") as c:
        added = await c.add_memory("Written after the poison event", kind="fact")
        listed = await c.list_memory()
        assert [r["id"] for r in listed["records"]] == [added["id"]]


async def test_a_redelivered_command_is_answered_on_the_replies_topic_and_logged_once(stack, settings, publisher,
                                                                                      new_agent):
    """The event log holds the command's event once; the second delivery's answer, same id and
    bytes, marked as a copy, goes to `memlane.memory.replies` for whoever waits on the id."""
    from events import AddMemory, encode
    from events.topics import COMMANDS, EVENTS, REDELIVERED, REPLIES

    tenant, agent, _ = await new_agent()
    cmd = AddMemory(command_id=str(uuid.uuid4()), tenant=tenant, agent=agent, issued_at=datetime.now(UTC),
                    summary="Sent twice, stored once", session="s1")
    for _ in range(2):  # an API retry after a timeout reuses the command id
        await publisher.producer.send_and_wait(settings.topic(COMMANDS.name), encode(cmd), key=COMMANDS.key_bytes(cmd))
    consumer = AIOKafkaConsumer(settings.topic(EVENTS.name), settings.topic(REPLIES.name),
                                bootstrap_servers=settings.kafka_bootstrap, auto_offset_reset="earliest", group_id=None,
                                isolation_level="read_committed")
    await consumer.start()
    try:
        seen: dict[str, list] = {EVENTS.name: [], REPLIES.name: []}

        async def answered():
            for tp, ms in (await consumer.getmany(timeout_ms=500)).items():
                seen[tp.topic.removeprefix(settings.topic_prefix)].extend(
                    m for m in ms if cmd.command_id.encode() in m.value)
            return bool(seen[REPLIES.name])

        # The answer is committed after the first decision: once it is read, so is every event
        # the command made (read to the events' end as of then).
        await eventually(answered)
        tps = [tp for tp in consumer.assignment() if tp.topic == settings.topic(EVENTS.name)]
        ends = await consumer.end_offsets(tps)
        while any([await consumer.position(tp) < ends[tp] for tp in tps]):
            await answered()
        [first], [again] = seen[EVENTS.name], seen[REPLIES.name]
        assert first.value == again.value and first.partition == again.partition
        assert (REDELIVERED, b"1") not in first.headers and (REDELIVERED, b"1") in again.headers
    finally:
        await consumer.stop()


async def test_a_redelivered_block_change_does_not_roll_the_block_back(stack, settings, publisher, new_agent):
    """A block's event carries no version: a redelivered command's answer (or, in a log written
    before answers went to their own topic, its copy among the events) must not overwrite the
    newer text in Redis."""
    from events import CurateBlock, encode
    from events.topics import COMMANDS

    tenant, agent, key = await new_agent()

    async def send(cmd):
        await publisher.producer.send_and_wait(settings.topic(COMMANDS.name), encode(cmd), key=COMMANDS.key_bytes(cmd))

    def curate(label: str, line: str) -> CurateBlock:
        return CurateBlock(command_id=str(uuid.uuid4()), tenant=tenant, agent=agent, issued_at=datetime.now(UTC),
                           label=label, action="add", line=line)

    first = curate("notes", "a")
    async with MemlaneClient(stack.api_url, key, session="s1") as c:

        async def blocks(want):
            got = {b["label"]: b["text"] for b in await c.blocks()}
            return got if got == want else None

        await send(first)
        await send(curate("notes", "b"))
        await eventually(partial(blocks, {"notes": "a\nb"}))
        await send(first)  # an API retry after a timeout reuses the command id
        await send(curate("other", "x"))  # later in the same partition: once it shows, the retry was decided
        await eventually(partial(blocks, {"notes": "a\nb", "other": "x"}))
        # A rebuild folds the log again into a new generation: the same blocks.
        old_gen = httpx.get(f"{stack.api_url}/health").json()["projection"]["generation"]
        proc = subprocess.run([sys.executable, "-m", "services.cli", "rebuild", "--target", "all"],
                              env=stack.env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        await eventually(lambda: httpx.get(f"{stack.api_url}/health").json()["projection"]["generation"] > old_gen,
                         timeout=60)
        assert await blocks({"notes": "a\nb", "other": "x"})
