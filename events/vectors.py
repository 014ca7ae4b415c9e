"""`memlane.vectors`: one embedding per model and content hash (compacted).

A vector belongs to the subject of the record it was computed for (`subject`): its content
hash is keyed by that subject's data key (`keyed_hash`) and its dense vector sealed under
it, so neither a guessed text nor the embedding can be read back once the key is destroyed.
A message with no subject (written without encryption) holds a plain hash and vector.

`memlane.history.vectors` carries the same message for a part of session history: there
`content_hash` is the part's point id (`events.rules.history.parts_of`), which the history
projection computes from the turn alone, and `subject` is the turn's (its member's, else
its agent's).
"""

from __future__ import annotations

import array
import base64
import hashlib
import sys
from collections.abc import Sequence
from typing import Any, Literal

from events.base import Message_

PLAIN_HASH_CHARS = 32


class VectorComputed(Message_):
    type: Literal["VectorComputed"] = "VectorComputed"
    model: str
    content_hash: str
    dim: int
    # Little-endian float32, base64: a fifth of the JSON-float size, and fast to decode.
    # Empty when `sealed` holds it.
    dense_b64: str = ""
    subject: str | None = None  # whose data key keys `content_hash` and seals `sealed`
    sealed: str | None = None  # the float32 bytes sealed under `subject`'s key (AAD: `vector_aad`)

    @classmethod
    def of(cls, model: str, content_hash: str, vector: Sequence[float], subject: str | None = None,
           cipher: Any = None) -> VectorComputed:
        arr = float32_of(vector)
        if sys.byteorder == "big":
            arr.byteswap()
        if subject is not None and cipher is not None:
            token = cipher.seal(subject, vector_aad(model, content_hash), arr.tobytes())
            return cls(model=model, content_hash=content_hash, dim=len(arr), subject=subject, sealed=token)
        return cls(model=model, content_hash=content_hash, dim=len(arr), dense_b64=base64.b64encode(arr.tobytes()).decode())

    def floats(self, cipher: Any = None) -> array.array:
        if self.sealed is not None:
            return float32_array(cipher.open(self.sealed, vector_aad(self.model, self.content_hash)))
        return float32_array(base64.b64decode(self.dense_b64))


def vector_aad(model: str, content_hash: str) -> bytes:
    """A sealed vector is bound to its message key: it cannot be moved to another text."""
    return f"{model}/{content_hash}".encode()


def keyed_hash(text: str, kid: str | None, cipher: Any) -> str:
    """The content hash a record's vector goes by: keyed by the data key `kid` its record was
    sealed under (so one subject's equal texts share a vector, and no one without the key can
    test a guess), or plain SHA-256 for a record sealed under no key."""
    mac = getattr(cipher, "mac", None)
    if kid is None or mac is None:
        return hashlib.sha256(text.encode()).hexdigest()[:PLAIN_HASH_CHARS]
    return mac(kid, text.encode()).hex()[:PLAIN_HASH_CHARS]


def float32_array(little_endian: bytes) -> array.array:
    """A vector as a compact float32 array, which Qdrant Edge takes faster than a list
    (docs/decisions/0004-qdrant-edge-embedded-index.md), with no numpy round trip."""
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
