"""The embedding port's contract, run against every embedder: the local ONNX model, the
OpenAI-compatible client (on the scripted model server) and the unit tests' in-process fake."""

from __future__ import annotations

import math

import pytest

from projections.embedders.onnx import OnnxMiniLM
from projections.embedders.openai_api import OpenAIEmbedder
from projections.embedders.port import Embedder
from tests.fakes.embedder import HashEmbedder

TEXTS = ["", "ok", "The customer prefers invoices by email", "Deploys go out on Tuesdays", "ok"]


@pytest.fixture(params=["onnx", "openai", "fake"])
def embedder(request) -> Embedder:
    if request.param == "onnx":
        return OnnxMiniLM(threads=1)
    if request.param == "openai":
        fake = request.getfixturevalue("fake")
        return OpenAIEmbedder(fake.url, "test-key", "text-embedding-3-small", 256)
    return HashEmbedder()


def test_one_vector_per_text_of_the_embedders_dimension(embedder):
    vectors = embedder.embed(TEXTS)
    assert len(vectors) == len(TEXTS)
    assert {len(v) for v in vectors} == {embedder.dim}
    assert all(math.isfinite(x) for v in vectors for x in v)
    assert embedder.embed([]) == []
    assert isinstance(embedder.model_id, str) and embedder.model_id


def test_a_text_gets_the_same_vector_alone_or_in_a_batch_and_another_text_another(embedder):
    together = embedder.embed(TEXTS)
    for text, v in zip(TEXTS, together):
        assert embedder.embed([text])[0] == pytest.approx(v, abs=1e-5)
    assert together[1] == pytest.approx(together[4], abs=1e-6)  # the same text twice
    assert together[2] != pytest.approx(together[3], abs=1e-3)


def test_what_an_embedder_keeps_is_what_it_embedded(embedder):
    vectors = embedder.embed(TEXTS)
    kept = embedder.cached(TEXTS)
    assert kept is None or kept == pytest.approx(vectors, abs=1e-6)
    assert embedder.cached(["never embedded by anyone"]) is None
