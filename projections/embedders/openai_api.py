"""Embeddings from an OpenAI-compatible `/v1/embeddings` endpoint (the choices: docs/decisions/0003-local-onnx-embeddings.md).

The model id names the served model and its dimension, so vectors of another model or
size never join records in a collection bound to this one. The index is 384-dimensional:
the model is asked for `embedding_dim` dimensions, and a vector of another size is refused.
"""

from __future__ import annotations

import base64
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import openai

from projections.embedders.port import content_hash, openai_model_id, recent

BATCH = 256


class OpenAIEmbedder:
    """`cache_size`: vectors of that many recent texts are kept (0: none), as `OnnxMiniLM`
    does: in the API, the extraction worker's similarity queries are the messages the
    history projection embeds when it folds the same turn, so each is asked for once."""

    def __init__(self, base_url: str | None, api_key: str, model: str, dim: int, timeout: float = 30.0,
                 cache_size: int = 0) -> None:
        self.model = model
        self.dim = dim
        self.model_id = openai_model_id(model, dim)
        self._client = openai.OpenAI(base_url=base_url or None, api_key=api_key or "not-needed", timeout=timeout, max_retries=3)
        self._cache_size = cache_size
        # content hash -> float32 vector: a list of Python floats took ~8x the memory.
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def cached(self, texts: Sequence[str]) -> list[list[float]] | None:
        return recent(self._cache, self._lock, texts)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not self._cache_size:
            return self._embed(texts).tolist()
        keys = [content_hash(t) for t in texts]
        with self._lock:
            found = {k: v for k in keys if (v := self._cache.get(k)) is not None}
            for k in found:
                self._cache.move_to_end(k)  # least recently used goes first
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
        return [found[k].tolist() for k in keys]

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        """Float32 unit vectors, one row per text."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), BATCH):
            chunk = list(texts[start : start + BATCH])
            # The client's low-level post, as the model client does: `embeddings.create`
            # built a typed object and a list of floats per vector before this code turned
            # them into an array; in a profile of the API under the extraction bench, that
            # parsing was more than half of the call. Errors, retries and timeouts are the
            # client's, as before.
            resp = self._client.post(
                "/embeddings",
                cast_to=object,
                body={"model": self.model, "input": chunk, "dimensions": self.dim, "encoding_format": "base64"},
            )
            vecs = vectors_of(resp, len(chunk), self.dim)
            # Cosine search assumes unit vectors; not every server normalises.
            vecs /= np.clip(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12, None)
            out[start : start + len(chunk)] = vecs
        return out


def vectors_of(resp: Any, count: int, dim: int) -> np.ndarray:
    """The float32 rows of an `/embeddings` answer, in input order.

    Each embedding is base64 (packed little-endian float32, as asked) or, from a server
    that ignores `encoding_format`, a list of numbers.
    """
    data = resp.get("data") if isinstance(resp, dict) else None
    if not isinstance(data, list) or len(data) != count:
        got = len(data) if isinstance(data, list) else "no"
        raise ValueError(f"the embeddings answer has {got} rows in data; {count} texts were sent")
    out = np.empty((count, dim), dtype=np.float32)
    seen: set[int] = set()
    for row in data:
        if not isinstance(row, dict):
            raise ValueError(f"an embeddings row is a JSON {type(row).__name__}, not an object")
        emb, i = row.get("embedding"), row.get("index")
        vec = np.frombuffer(base64.b64decode(emb), dtype="<f4") if isinstance(emb, str) else np.asarray(emb, dtype=np.float32)
        if vec.shape != (dim,):
            raise ValueError(f"embedding has {vec.size} dimensions; the index needs {dim}")
        if not isinstance(i, int) or not 0 <= i < count or i in seen:
            raise ValueError(f"embedding index {i!r} is not one of 0..{count - 1}, or comes twice")
        seen.add(i)
        out[i] = vec
    return out
