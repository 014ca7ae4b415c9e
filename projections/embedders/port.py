"""The embedding port: what an embedder offers, the key of a text's vector, and the model id
vectors carry. Both embedders and their readers import it; it imports neither embedder."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

import numpy as np

# The local model's id (all-MiniLM-L6-v2, int8 ONNX): `projections.embedders.onnx.OnnxMiniLM`.
MODEL_ID = "all-MiniLM-L6-v2-int8"


class Embedder(Protocol):
    model_id: str
    dim: int

    def embed(self, texts: Sequence[str]) -> list[list[float]]: ...

    def cached(self, texts: Sequence[str]) -> list[list[float]] | None:
        """The vectors of `texts` when every one was embedded recently (kept by the embedder),
        without a model call; else None. An embedder that keeps none answers None."""
        ...


def recent(cache: OrderedDict[str, np.ndarray], lock: threading.Lock, texts: Sequence[str]) -> list[list[float]] | None:
    """`Embedder.cached` over an embedder's cache of recent vectors (content hash -> vector,
    least recently used first): every text's vector, each now most recent, or None."""
    keys = [content_hash(t) for t in texts]
    with lock:
        if not keys or any(k not in cache for k in keys):
            return None
        for k in keys:
            cache.move_to_end(k)
        return [cache[k].tolist() for k in keys]


def content_hash(text: str) -> str:
    """Plain hash of a text: an embedder's cache key, and the key in `memlane.vectors` of a
    record sealed under no key (a sealed record's is keyed: `events.vectors.keyed_hash`)."""
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def openai_model_id(model: str, dim: int) -> str:
    """A served model's id names its dimension too, so vectors of another model or size never
    join records in a collection bound to this one."""
    return f"openai:{model}:{dim}"


def embedder_model_id(settings) -> str:
    """The model id vectors carry, without loading the model (the Qdrant projection joins on it)."""
    if settings.embeddings == "openai":
        return openai_model_id(settings.embedding_model, settings.embedding_dim)
    return MODEL_ID
