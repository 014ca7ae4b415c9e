"""The contract: every event and command on memlane's topics, with no I/O.

Agent platforms import this package to produce valid events.
"""

from events.codec import ContractError, decode, encode
from events.commands import (
    AddMemory,
    Command,
    ConfigureAgent,
    CurateBlock,
    DeleteMemory,
    EditMemory,
    ExpireTurns,
    PinMemory,
    ReportOutcome,
    SweepExpired,
    TurnOutcome,
    UnpinMemory,
)
from events.config import AgentConfig, MemoryConfig
from events.memory import (
    AgentConfigured,
    BlockChanged,
    CommandRejected,
    MemoryEvent,
    RecordAdded,
    RecordDeleted,
    RecordExpired,
    RecordPinned,
    RecordRevised,
    RecordSuperseded,
    RecordUnpinned,
)
from events.record import MemoryRecord, Provenance, Scope, Source, Status
from events.topics import TOPICS, Topic
from events.turns import Message, SessionEnded, ToolCall, TurnCommitted, TurnEvent, TurnRolledBack
from events.vectors import VectorComputed

__all__ = [
    "AgentConfig",
    "AgentConfigured",
    "BlockChanged",
    "ConfigureAgent",
    "CurateBlock",
    "MemoryConfig",
    "AddMemory",
    "Command",
    "CommandRejected",
    "ContractError",
    "DeleteMemory",
    "EditMemory",
    "ExpireTurns",
    "MemoryEvent",
    "MemoryRecord",
    "Message",
    "PinMemory",
    "Provenance",
    "ReportOutcome",
    "RecordAdded",
    "RecordDeleted",
    "RecordExpired",
    "RecordPinned",
    "RecordRevised",
    "RecordSuperseded",
    "RecordUnpinned",
    "Scope",
    "SessionEnded",
    "SweepExpired",
    "Source",
    "Status",
    "TOPICS",
    "ToolCall",
    "Topic",
    "TurnCommitted",
    "TurnEvent",
    "TurnOutcome",
    "TurnRolledBack",
    "UnpinMemory",
    "VectorComputed",
    "decode",
    "encode",
]
