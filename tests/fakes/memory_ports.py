"""In-memory adapters of the memory service's own ports, for unit tests of its rules (no Kafka, no Redis)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from events.codec import PLAIN, Codec
from events.config import AgentConfig
from events.record import MemoryRecord
from projections.records import MemoryFold


@dataclass
class InMemoryCommandPublisher:
    """Keeps what was sent, in order: (command, its encoded bytes)."""

    sent: list[tuple[Any, bytes]] = field(default_factory=list)
    codec: Codec = PLAIN

    async def send(self, command: Any, data: bytes) -> None:
        self.sent.append((command, data))

    @property
    def commands(self) -> list[Any]:
        return [c for c, _ in self.sent]


@dataclass
class InMemoryUsageRecorder:
    records: list[Any] = field(default_factory=list)

    async def record(self, usage: Any) -> None:
        self.records.append(usage)


@dataclass
class ConfiguredFold(MemoryFold):
    """The reference record view plus each agent's configuration, as the Redis view keeps it."""

    configs: dict[tuple[str, str], AgentConfig] = field(default_factory=dict)

    async def config(self, tenant: str, agent: str) -> AgentConfig | None:
        return self.configs.get((tenant, agent))

    async def get_many(self, tenant: str, agent: str, rids: list[str]) -> list[MemoryRecord]:
        return [r for rid in rids if (r := await self.get(tenant, agent, rid)) is not None]

    def applied(self) -> _Applied:
        return _Applied()


class _Applied:
    """Applies happen before they are read here, so what a wait looks for is there or never comes."""

    def announced(self, key: Any) -> bool:
        return False  # nothing is announced here: what a wait looks for is read

    async def wait(self, key: Any, shown: Any, timeout: float, version: int = 0) -> bool:
        return await shown()
