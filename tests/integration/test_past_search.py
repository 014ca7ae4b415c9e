"""A ranked search as of a point (`workers.followers.past_index`): for random points of a generated
log, the index built from the fold up to the point answers every search as a Qdrant projection
replayed from the log up to that point answers it (same records, same scores, same order), in
each mode and filter; a record no longer live gets its vector from the embedder."""

from __future__ import annotations

import hashlib
import uuid

import numpy as np
from aiokafka import AIOKafkaProducer
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from events.codec import PLAIN
from events.topics import EVENTS, VECTORS
from events.vectors import VectorComputed
from projections.embedders.port import MODEL_ID, content_hash
from projections.qdrant.index import EdgeIndex, SearchFilter
from tests.integration.test_projection_law import ledger_events, op
from workers.followers.past_index import PastIndexes
from workers.followers.past_memory import PastMemory, Point
from workers.followers.qdrant_projection import QdrantProjection
from workers.runtime.kafka_io import ensure_topics

QUERIES = ["tea", "coffee in Lisbon", "dark mode", "run"]
FILTERS = [
    SearchFilter(tenant="t", agent="a", scopes=("AGENT", "SESSION"), session="s", preview=False),
    SearchFilter(tenant="t", agent="a", scopes=("AGENT",), session=None, preview=False, kind="fact"),
    SearchFilter(tenant="t", agent="a", scopes=("AGENT", "SESSION"), session="s", preview=False,
                 not_kinds=("episode",)),
]


def vector(text: str) -> list[float]:
    """A unit vector fixed by the text: what the embedding worker would have written for it."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    v = np.random.default_rng(seed).standard_normal(384).astype(np.float32)
    return (v / np.linalg.norm(v)).tolist()


async def publish(settings, events: list) -> tuple[object, list[int]]:
    """A topic prefix of its own holding `events` and each text's vector; the events' offsets."""
    s = settings.model_copy(update={"topic_prefix": f"{settings.topic_prefix}pastq{uuid.uuid4().hex[:6]}."})
    await ensure_topics(s, [EVENTS, VECTORS])
    p = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap)
    await p.start()
    try:
        offsets = []
        for e in events:
            offsets.append((await p.send_and_wait(s.topic(EVENTS.name), PLAIN.encode(e), key=EVENTS.key_bytes(e))).offset)
        for text in {e.record.text for e in events if hasattr(e, "record")}:
            v = VectorComputed.of(MODEL_ID, content_hash(text), vector(text))
            await p.send_and_wait(s.topic(VECTORS.name), PLAIN.encode(v), key=VECTORS.key_bytes(v))
        return s, offsets
    finally:
        await p.stop()


async def replayed(settings, path, stop: int | None) -> EdgeIndex:
    """The memory index a projection builds from the log up to `stop` (the whole log: None)."""
    index = EdgeIndex(path)
    partition = EVENTS.partition_of(b"t/a")
    projection = QdrantProjection(settings, index, codec=PLAIN)
    await projection.run(until_caught_up=True, stop=None if stop is None else {partition: stop})
    return index


def answers(index) -> list:
    out = []
    for f in FILTERS:
        for q in QUERIES:
            for mode in ("lexical", "vector", "hybrid"):
                hits = index.search(f, vector(q), q, 10, mode)
                out.append(sorted((-round(h.score, 5), h.record_id) for h in hits))
    return out


@hsettings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, min_size=1, max_size=16), data=st.data())
async def test_a_search_as_of_a_point_is_a_projection_replayed_to_there(settings, tmp_path_factory, ops, data):
    events = ledger_events(ops)
    s, offsets = await publish(settings, events)
    root = tmp_path_factory.mktemp("past")
    live = await replayed(s, root / "live", None)
    past, indexes = PastMemory(s, PLAIN), PastIndexes(root / "indexes")

    async def embed(texts: list[str]) -> list[list[float]]:
        return [vector(t) for t in texts]

    try:
        for cut in data.draw(st.lists(st.integers(0, len(events)), min_size=1, max_size=3, unique=True)):
            position = offsets[cut] if cut < len(offsets) else offsets[-1] + 1
            expected = await replayed(s, root / f"cut{cut}", position)
            try:
                at = await indexes.index(await past.past("t", "a", Point(position=position)), live, embed)
                assert answers(at) == answers(expected), cut
            finally:
                expected.close()
    finally:
        await past.aclose()
        indexes.close()
        live.close()

