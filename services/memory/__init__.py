"""The memory service behind HTTP, MCP and the client: reads, command submission and usage recording."""

from services.errors import ApiError
from services.memory.context import Context
from services.memory.service import MemoryService

__all__ = ["ApiError", "Context", "MemoryService"]
