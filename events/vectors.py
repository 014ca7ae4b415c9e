"""`memlane.vectors`: one embedding per model and content hash (compacted)."""

from __future__ import annotations

import array
import base64
import sys
from collections.abc import Sequence
from typing import Any, Literal

from events.base import Message_


class VectorComputed(Message_):
    type: Literal["VectorComputed"] = "VectorComputed"
    model: str
    content_hash: str
    dim: int
    # Little-endian float32, base64: a fifth of the JSON-float size, and fast to decode.
    dense_b64: str

    @classmethod
    def of(cls, model: str, content_hash: str, vector: Sequence[float]) -> VectorComputed:
        arr = float32_of(vector)
        if sys.byteorder == "big":
            arr.byteswap()
        return cls(model=model, content_hash=content_hash, dim=len(arr), dense_b64=base64.b64encode(arr.tobytes()).decode())

    def floats(self) -> array.array:
        return float32_array(base64.b64decode(self.dense_b64))


def float32_array(little_endian: bytes) -> array.array:
    """A vector as a compact float32 array, which Qdrant Edge takes faster than a list
    (docs/qdrant-edge.md), with no numpy round trip."""
    a = array.array("f", little_endian)
    if sys.byteorder == "big":
        a.byteswap()
    return a


def float32_of(vector: Any) -> array.array:
    """A vector (a list of floats, or a float32 buffer such as a numpy row) as a native float32
    array. A float32 buffer is copied as it is: converted number by number, a row took 30 times
    as long."""
    if not isinstance(vector, (list, tuple)):
        try:
            view = memoryview(vector)
        except TypeError:
            view = None
        if view is not None and view.format == "f" and view.ndim == 1 and view.c_contiguous:
            arr = array.array("f")
            arr.frombytes(view.cast("B"))
            return arr
    return array.array("f", vector)
