"""An in-process embedder for unit tests that need the embedding port but no model: each text's
vector is the scripted model server's hashed embedding of it (bag of hashed words)."""

from __future__ import annotations

from collections.abc import Sequence

from projections.embedders.port import Embedder
from tests.fakes.model_server import hashed_embedding


class HashEmbedder:
    model_id = "test-hash-embedder"

    def __init__(self, dim: int = 64) -> None:
        self.dim = dim

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [hashed_embedding(t, self.dim).tolist() for t in texts]

    def cached(self, texts: Sequence[str]) -> list[list[float]] | None:
        return None  # it keeps no vectors


def _implements(e: HashEmbedder) -> Embedder:
    return e  # the type checker holds the fake to the port
