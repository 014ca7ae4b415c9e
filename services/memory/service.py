"""The memory service: its reads and its command submission over one record view, and the usage they record."""

from __future__ import annotations

from typing import TYPE_CHECKING

from events.config import AgentConfig
from services.memory.commands import MemoryCommands
from services.memory.ports import CommandPublisher, UsageRecorder
from services.memory.reads import MemoryReads
from services.memory.usage import UsageLog
from settings import Settings

if TYPE_CHECKING:
    from projections.embedding_port import Embedder
    from projections.redis_records import RedisRecords
    from workers.memory_shards import MemoryShards


class MemoryService:
    def __init__(self, settings: Settings, records: RedisRecords, memory: MemoryShards | None, embedder: Embedder,
                 publisher: CommandPublisher, recorder: UsageRecorder) -> None:
        self.settings = settings
        self.embedder = embedder
        self.usage = UsageLog(recorder, embedder.model_id if embedder is not None else "embedder")
        self.reads = MemoryReads(settings, records, memory, embedder, self.usage)
        self.commands = MemoryCommands(settings, records, memory, publisher)

    def use_shards(self, memory: MemoryShards) -> None:
        self.reads.memory = self.commands.memory = memory

    async def config(self, tenant: str, agent: str) -> AgentConfig:
        return await self.reads.config(tenant, agent)
