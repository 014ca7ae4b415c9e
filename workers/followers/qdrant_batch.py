"""What the Qdrant projection writes to its index at once, from one poll of its topics, and
what it does once that is written (commands answered, positions moved, futures resolved)."""

from __future__ import annotations

import array
import asyncio
from typing import Any

from events.lean import LeanEvent, LeanRecord
from projections.qdrant.index import RecordKey
from projections.records import Erasure


class Batch:
    def __init__(self) -> None:
        self.upserts: dict[RecordKey, tuple[LeanRecord, array.array]] = {}
        self.deletes: set[RecordKey] = set()
        self.shadows: list[RecordKey] = []
        self.done: list[LeanEvent] = []
        self.heals: list[tuple[asyncio.Future, tuple[int, int]]] = []
        self.purges: list[Erasure] = []  # applied before the upserts
        self.purge_futs: list[asyncio.Future] = []  # peers' purges: resolved once flushed
        self.positions: dict[str, int] = {}
        self.read_to: dict[str, int] = {}  # events' positions after this batch, commit markers and all
        self.events: list[LeanEvent] = []  # for `also`
        self.event_positions: list[tuple[str, int]] = []
        self.spans: list[Any] = []  # traced messages' spans (`workers.runtime.tracing`): ended once written
        self.seen = 0

    def writes(self) -> int:
        return len(self.upserts) + len(self.deletes) + len(self.shadows) + len(self.purges)
