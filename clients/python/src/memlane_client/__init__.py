"""memlane's Python client: the HTTP API (async and blocking) and, with the `kafka` extra, the
publisher of an agent platform's turn events."""

from __future__ import annotations

from typing import Any

from memlane_client.http import Found, MemlaneClient, MemlaneError
from memlane_client.records import Provenance, Record
from memlane_client.sync import SyncMemlaneClient

__all__ = ["Found", "MemlaneClient", "MemlaneError", "Provenance", "Record", "SyncMemlaneClient", "TurnPublisher"]


def __getattr__(name: str) -> Any:
    # The publisher needs the `kafka` extra (aiokafka): imported only when asked for.
    if name == "TurnPublisher":
        from memlane_client.publisher import TurnPublisher

        return TurnPublisher
    raise AttributeError(name)
