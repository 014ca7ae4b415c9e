"""Query embedding in turns between tenants: one tenant's backlog delays another's query by at
most a chunk per slot, and a tenant past its queue's bound is refused with 429 and how long to
wait, while another tenant is still served."""

from __future__ import annotations

import asyncio
import threading

import pytest

from services.errors import ApiError
from services.memory.fair_embedding import FairEmbedding, chunks
from tests.fakes.embedder import HashEmbedder


class Gated(HashEmbedder):
    """Embeds only when the test lets it, one call at a time, and notes what each call held."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[str]] = []
        self.go = threading.Semaphore(0)

    def embed(self, texts):
        self.go.acquire()
        self.calls.append(list(texts))
        return super().embed(texts)


async def until(cond) -> None:
    while not cond():
        await asyncio.sleep(0)


def test_chunks_keep_short_texts_together_and_long_ones_apart():
    assert chunks(["a", "b", "c"]) == [["a", "b", "c"]]
    assert chunks(["x" * 1500, "y" * 1500, "z"]) == [["x" * 1500], ["y" * 1500, "z"]]
    assert [len(c) for c in chunks(["q"] * 20)] == [8, 8, 4]


async def test_a_tenants_backlog_does_not_hold_back_another_tenants_query():
    e = Gated()
    fair = FairEmbedding(e, slots=1, queued=1000)
    try:
        hostile = asyncio.ensure_future(fair.embed("hostile", ["h" * 1500 + str(i) for i in range(10)]))
        await until(lambda: "hostile" in fair.waiting)
        victim = asyncio.ensure_future(fair.embed("victim", ["where is the office?"]))
        await until(lambda: "victim" in fair.waiting)
        for _ in range(11):
            e.go.release()
        [vec] = await victim
        await hostile
        assert vec == HashEmbedder().embed(["where is the office?"])[0]
        # The hostile tenant's first chunk was already taken; the victim's came next, not 10th.
        order = ["victim" if c == ["where is the office?"] else "hostile" for c in e.calls]
        assert order.index("victim") == 1 and len(order) == 11, order
    finally:
        await fair.aclose()


async def test_past_its_bound_a_tenant_is_refused_with_retry_after_and_another_is_served():
    e = Gated()
    fair = FairEmbedding(e, slots=1, queued=10)
    try:
        first = asyncio.ensure_future(fair.embed("hostile", ["q"] * 8))
        await until(lambda: fair.texts.get("hostile") == 8)
        with pytest.raises(ApiError) as refused:
            await fair.embed("hostile", ["q"] * 3)
        assert (refused.value.status, refused.value.code, refused.value.retry_after) == (429, "RATE_LIMITED", 1)
        other = asyncio.ensure_future(fair.embed("victim", ["q"] * 3))
        e.go.release()
        e.go.release()
        assert len(await first) == 8 and len(await other) == 3
        assert fair.texts == {}  # nothing left counted against either tenant
    finally:
        await fair.aclose()


async def test_a_tenant_holds_at_most_half_the_slots_so_another_finds_one_free():
    from collections import deque

    from services.memory.fair_embedding import _Job

    fair = FairEmbedding(HashEmbedder(), slots=2)
    fair.waiting["hostile"] = deque([_Job("hostile", ["a"]), _Job("hostile", ["b"])])
    first = fair._next()
    assert first is not None and first.texts == ["a"] and fair.running == {"hostile": 1}
    assert fair._next() is None  # its second chunk waits though a slot is free
    fair.waiting["victim"] = deque([_Job("victim", ["q"])])
    taken = fair._next()
    assert taken is not None and taken.tenant == "victim" and fair.running == {"hostile": 1, "victim": 1}


async def test_texts_the_embedder_keeps_are_answered_without_a_model_call_or_a_queue():
    from projections.embedders.onnx import OnnxMiniLM

    class Kept(Gated):
        """Keeps what it embedded, as the API's embedder does."""

        def __init__(self) -> None:
            super().__init__()
            self.kept: dict[str, list[float]] = {}

        def embed(self, texts):
            out = super().embed(texts)
            self.kept.update(zip(texts, out, strict=True))
            return out

        def cached(self, texts):
            return [self.kept[t] for t in texts] if all(t in self.kept for t in texts) else None

    e = Kept()
    fair = FairEmbedding(e, slots=1, queued=1000)
    try:
        first = asyncio.ensure_future(fair.embed("t", ["where is the office?"]))
        e.go.release()
        vec = await first
        # No release this time: a model call would block, and a queued chunk would wait.
        assert await asyncio.wait_for(fair.embed("t", ["where is the office?"]), 5) == vec
        assert e.calls == [["where is the office?"]] and fair.waiting == {}
        # A batch with one text not kept goes to the model whole.
        both = asyncio.ensure_future(fair.embed("t", ["where is the office?", "and the lift?"]))
        e.go.release()
        assert len(await both) == 2 and e.calls[-1] == ["where is the office?", "and the lift?"]
    finally:
        for _ in range(3):
            e.go.release()  # a call that went to the model after all does not hang the test
        await fair.aclose()
    # The local model keeps vectors only with a cache, and answers for all of the texts or none.
    onnx = OnnxMiniLM(threads=1, cache_size=10)
    assert onnx.cached(["kept"]) is None
    [v] = onnx.embed(["kept"])
    assert onnx.cached(["kept"]) == [v] and onnx.cached(["kept", "not kept"]) is None
    assert OnnxMiniLM(threads=1).cached(["kept"]) is None
