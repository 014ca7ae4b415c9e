"""`memlane.vectors`: one embedding per model and content hash (compacted)."""

from __future__ import annotations

from typing import Literal

from events.base import Message_


class VectorComputed(Message_):
    type: Literal["VectorComputed"] = "VectorComputed"
    model: str
    content_hash: str
    dense: list[float]
