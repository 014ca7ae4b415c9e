"""The local embedder: batching by token count changes how texts are grouped, never a vector."""

from __future__ import annotations

import threading

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from projections.embedders.onnx import BATCH_MAX, BATCH_SPREAD, BATCH_TOKENS, OnnxMiniLM, length_batches

TEXTS = [
    "",
    "ok",
    "Noted.",
    "Fact 1: code 1a2b3c4d for s1",
    "Fact 22: code ffffffff for s22",
    "Fact 333: code 0a0a0a0a for s33",
    "The customer prefers invoices by email, not by post, and wants them on the first of the month.",
    " ".join(["a long message about travel plans and the budget for the trip"] * 30),  # truncated at 256 tokens
]


def test_a_batch_gives_each_text_the_vector_it_gets_alone():
    emb = OnnxMiniLM(threads=1)
    together = np.array(emb.embed(TEXTS))
    alone = np.array([emb.embed([t])[0] for t in TEXTS])
    assert together.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(together, alone, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)


def test_the_cache_embeds_each_text_once_across_threads():
    emb = OnnxMiniLM(threads=1, cache_size=100)
    plain = np.array(OnnxMiniLM(threads=1).embed(TEXTS))
    embedded: list[int] = []
    run = emb._run

    def counting(encs):
        embedded.append(len(encs))
        return run(encs)

    emb._run = counting
    out: dict[int, np.ndarray] = {}

    def worker(n: int) -> None:
        out[n] = np.array(emb.embed(TEXTS[n % 2 :] + TEXTS[: n % 2]))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(embedded) == len(TEXTS)
    np.testing.assert_allclose(out[0], plain, atol=1e-5)
    np.testing.assert_allclose(out[1], np.roll(plain, -1, axis=0), atol=1e-5)


@given(st.lists(st.integers(min_value=2, max_value=300), max_size=120))
def test_length_batches_cover_every_text_once_within_the_spread(lengths):
    batches = length_batches(lengths)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) <= BATCH_MAX
        if len(b) > 1:
            shortest, longest = min(lengths[i] for i in b), max(lengths[i] for i in b)
            assert longest <= min(max(shortest, 4) * BATCH_SPREAD, BATCH_TOKENS)
