"""What the narrow Redis views (notes, profiles, session memory, shared memory) read through
the record view: its client, its data keys and the namespace of the generation it serves.
A protocol, so those views never import the record view that folds their events."""

from __future__ import annotations

from typing import Any, Protocol

from events.codec import Codec
from projections.records import Keys


class ViewStore(Protocol):
    r: Any
    keys: Keys | None
    codec: Codec

    async def namespace(self) -> str:
        """The key namespace of the generation reads are served from."""
        ...
