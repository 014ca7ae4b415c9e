"""Memory as of a point of the log (`workers.followers.past_memory`): for random points of a
generated log, the fold up to the point lists, reads and gives the versions a Redis projection
rebuilt from the log cut there gives, whether the point is a position or a time; what was purged
or erased after the point stays gone."""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime, timedelta

from aiokafka import AIOKafkaProducer
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from events.codec import PLAIN
from events.memory import RecordsPurged
from events.topics import EVENTS
from projections.redis.record_view import RedisRecords
from tests.integration.test_projection_law import ledger_events, op, snapshot
from tests.redis_at import redis_at
from workers.followers.past_memory import PastMemory, Point
from workers.runtime.kafka_io import ensure_topics

_gens = itertools.count(7_000_000)
BASE_MS = int(datetime(2026, 2, 1, tzinfo=UTC).timestamp() * 1000)
STEP_MS = 1000  # the log time between two events


async def publish(settings, events: list) -> tuple[object, list[int]]:
    """A topic of its own holding `events` (keyed by their agent, one second apart); their offsets."""
    s = settings.model_copy(update={"topic_prefix": f"{settings.topic_prefix}past{uuid.uuid4().hex[:6]}."})
    await ensure_topics(s, [EVENTS])
    return s, await append(s, events)


async def append(s, events: list) -> list[int]:
    p = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap)
    await p.start()
    try:
        offsets = []
        for i, e in enumerate(events):
            md = await p.send_and_wait(s.topic(EVENTS.name), PLAIN.encode(e), key=EVENTS.key_bytes(e),
                                       timestamp_ms=BASE_MS + i * STEP_MS)
            offsets.append(md.offset)
        return offsets
    finally:
        await p.stop()


async def rebuilt(settings, events: list, rids: list[str]) -> dict:
    view = RedisRecords(redis_at(settings.redis_url)(pooled=True), generation=next(_gens))
    try:
        await view.fill(events)
        return await snapshot(view, rids)
    finally:
        keys = [k async for k in view.r.scan_iter(f"ml:g{view.fixed_generation}:*", count=10_000)]
        if keys:
            await view.r.delete(*keys)
        await view.aclose()


@hsettings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, min_size=1, max_size=20), data=st.data())
async def test_memory_as_of_a_point_is_a_projection_rebuilt_from_the_log_cut_there(settings, ops, data):
    events = ledger_events(ops)
    rids = sorted({e.record.id for e in events if hasattr(e, "record")})
    s, offsets = await publish(settings, events)
    async with PastMemory(s, PLAIN) as past:
        for cut in data.draw(st.lists(st.integers(0, len(events)), min_size=1, max_size=3, unique=True)):
            expected = await rebuilt(settings, events[:cut], rids)
            position = offsets[cut] if cut < len(offsets) else offsets[-1] + 1
            assert await snapshot(await past.fold("t", "a", Point(position=position)), rids) == expected, cut
            at = datetime.fromtimestamp((BASE_MS + cut * STEP_MS) / 1000, UTC)  # the first event not before it
            assert await snapshot(await past.fold("t", "a", Point(at=at)), rids) == expected, cut


async def test_what_was_purged_after_a_point_is_gone_as_of_it_too(settings):
    events = ledger_events([("add", "tea", None, False), ("add", "Lisbon", None, False), ("delete", 0)])
    [tea] = [e.record.id for e in events if e.type == "RecordAdded" and e.record.summary == "tea"]
    last = events[-1]
    purge = RecordsPurged(event_id="purge-1", command_id="retention", tenant="t", agent="a",
                          occurred_at=last.occurred_at + timedelta(days=200), record_ids=[tea])
    s, offsets = await publish(settings, events)
    before_delete = Point(position=offsets[-1])  # tea was live then
    async with PastMemory(s, PLAIN) as past:
        assert [r.summary for r in (await (await past.fold("t", "a", before_delete)).page("t", "a", 10)).records] \
            == ["Lisbon", "tea"]
        # The purge comes after the events were read and kept: the next read still applies it.
        await append(s, [purge])
        fold = await past.fold("t", "a", before_delete)
        assert await fold.get("t", "a", tea) is None and await fold.history("t", "a", tea) == []
        assert [r.summary for r in (await fold.page("t", "a", 10)).records] == ["Lisbon"]


async def test_a_members_erasure_filed_under_the_workspace_reaches_the_past_of_every_agent(settings):
    from events.commands import WORKSPACE
    from events.memory import RecordAdded, SubjectErased
    from events.record import MemoryRecord, Scope

    at = datetime(2026, 2, 1, tzinfo=UTC)
    theirs = MemoryRecord(id="r-fay", version=1, created=at, modified=at, tenant="t", agent="a", scope=Scope.USER,
                          user="fay", kind="fact", summary="Fay's locker code is 4411")
    ours = theirs.model_copy(update={"id": "r-team", "scope": Scope.AGENT, "user": None,
                                     "summary": "The team meets at nine"})
    added = [RecordAdded(event_id=f"e-{r.id}", command_id=f"c-{r.id}", tenant="t", agent="a", occurred_at=at,
                         record=r) for r in (theirs, ours)]
    erased = SubjectErased(event_id="e-erase", command_id="c-erase", tenant="t", agent=WORKSPACE,
                           occurred_at=at + timedelta(days=1), user="fay")
    s, offsets = await publish(settings, [*added, erased])
    async with PastMemory(s, PLAIN) as past:
        fold = await past.fold("t", "a", Point(position=offsets[1] + 1))  # before the erasure
    assert [r.id for r in (await fold.page("t", "a", 10)).records] == ["r-team"]
    assert await fold.get("t", "a", "r-fay") is None
