"""The memlane-client package (clients/python) with the server's own types: records read as
`MemoryRecord`, an agent's configuration as `AgentConfig`."""

from __future__ import annotations

from typing import Any

from memlane_client import Found, MemlaneError, SyncMemlaneClient
from memlane_client import MemlaneClient as _Client
from memlane_client.publisher import TurnPublisher

from events.config import AgentConfig
from events.record import MemoryRecord

__all__ = ["Found", "MemlaneClient", "MemlaneError", "SyncMemlaneClient", "TurnPublisher"]


class MemlaneClient(_Client):
    record_type: type[Any] = MemoryRecord

    async def config(self) -> AgentConfig:
        return AgentConfig.model_validate(await super().config())
