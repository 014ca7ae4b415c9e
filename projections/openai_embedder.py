"""Embeddings from an OpenAI-compatible `/v1/embeddings` endpoint (DESIGN.md, "Embeddings").

The model id names the served model and its dimension, so vectors of another model or
size never join records in a collection bound to this one. The index is 384-dimensional:
the model is asked for `embedding_dim` dimensions, and a vector of another size is refused.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import openai

from projections.embedder import content_hash

BATCH = 256


class OpenAIEmbedder:
    """`cache_size`: vectors of that many recent texts are kept (0: none), as `OnnxMiniLM`
    does: in the API, the extraction worker's similarity queries are the messages the
    history projection embeds when it folds the same turn, so each is asked for once."""

    def __init__(self, base_url: str | None, api_key: str, model: str, dim: int, timeout: float = 30.0,
                 cache_size: int = 0) -> None:
        self.model = model
        self.dim = dim
        self.model_id = f"openai:{model}:{dim}"
        self._client = openai.OpenAI(base_url=base_url or None, api_key=api_key or "not-needed", timeout=timeout, max_retries=3)
        self._cache_size = cache_size
        self._cache: OrderedDict[str, list[float]] = OrderedDict()  # content hash -> vector
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not self._cache_size:
            return self._embed(texts)
        keys = [content_hash(t) for t in texts]
        with self._lock:
            found = {k: v for k in keys if (v := self._cache.get(k)) is not None}
        todo = dict(zip(keys, texts))
        for k in found:
            todo.pop(k, None)
        if todo:
            vecs = self._embed(list(todo.values()))
            with self._lock:
                for k, v in zip(todo, vecs):
                    self._cache[k] = found[k] = v
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return [found[k] for k in keys]

    def _embed(self, texts: Sequence[str]) -> list[list[float]]:
        out: list[list[float]] = []
        for start in range(0, len(texts), BATCH):
            chunk = list(texts[start : start + BATCH])
            resp = self._client.embeddings.create(model=self.model, input=chunk, dimensions=self.dim)
            rows = sorted(resp.data, key=lambda d: d.index)
            for d in rows:
                if len(d.embedding) != self.dim:
                    raise ValueError(f"embedding has {len(d.embedding)} dimensions; the index needs {self.dim}")
            vecs = np.asarray([d.embedding for d in rows], dtype=np.float32)
            # Cosine search assumes unit vectors; not every server normalises.
            vecs /= np.clip(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12, None)
            out.extend(vecs.tolist())
        return out
