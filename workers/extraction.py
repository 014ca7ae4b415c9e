"""The extraction worker: reads `memlane.turns`, forwards outcomes to the ledger.

Each turn's outcome goes to the ledger as a TurnOutcome command keyed by agent, so the
ledger never reads `memlane.turns`. add_memory tool calls carried in a committed turn
become AddMemory commands staged on that turn. Model-made extraction builds on this.
"""

from __future__ import annotations

import uuid
from typing import Any

import structlog
from pydantic import ValidationError

from events.base import utcnow
from events.commands import AddMemory, TurnOutcome
from events.record import Provenance, Source
from events.topics import COMMANDS, TURNS
from events.turns import TurnCommitted, TurnRolledBack
from events.codec import encode
from workers.runtime import Out, Processor

log = structlog.get_logger()
NAMESPACE = uuid.UUID("0e3b7f0c-4f4e-4d0b-8d8a-7f7d0f6a5b21")


def command_id(event_id: str, part: str) -> str:
    return str(uuid.uuid5(NAMESPACE, f"{event_id}/{part}"))


def provenance(turn: TurnCommitted | TurnRolledBack, source: Source) -> Provenance:
    return Provenance(
        source=source,
        execution_id=turn.execution_id,
        invocation=turn.invocation,
        agent_version=turn.agent_version,
        session=turn.session,
        turn=turn.turn,
        modified_by=f"agent:{turn.agent}",
    )


def tool_writes(turn: TurnCommitted) -> list[AddMemory]:
    """add_memory calls the agent made during the turn, as commands staged on the turn."""
    out = []
    for msg in turn.messages:
        for call in msg.tool_calls:
            if call.name != "add_memory":
                continue
            try:
                out.append(
                    AddMemory(
                        command_id=command_id(turn.event_id, call.id),
                        tenant=turn.tenant,
                        agent=turn.agent,
                        issued_at=turn.occurred_at,
                        provenance=provenance(turn, Source.TOOL).model_copy(
                            update={"source_message_ids": [msg.id]}
                        ),
                        turn_ref=turn.turn_ref,
                        preview=turn.preview,
                        session=turn.session,
                        **call.arguments,
                    )
                )
            except (ValidationError, TypeError) as e:
                log.warning("tool_call_invalid", call_id=call.id, error=str(e)[:500], agent=turn.agent)
    return out


def outcome(turn: TurnCommitted | TurnRolledBack) -> TurnOutcome:
    committed = isinstance(turn, TurnCommitted)
    return TurnOutcome(
        command_id=command_id(turn.event_id, "outcome"),
        tenant=turn.tenant,
        agent=turn.agent,
        issued_at=turn.occurred_at or utcnow(),
        provenance=provenance(turn, Source.TOOL),
        turn_ref=turn.turn_ref,
        preview=turn.preview,
        committed=committed,
        reason="" if committed else (turn.reason or "turn rolled back"),
    )


class ExtractionProcessor(Processor):
    name = "extraction"
    sources = (TURNS.name,)
    transactional = True

    async def process(self, source: str, partition: int, offset: int, turn: Any) -> list[Out]:
        if not isinstance(turn, (TurnCommitted, TurnRolledBack)):
            return []
        commands: list[Any] = tool_writes(turn) if isinstance(turn, TurnCommitted) else []
        commands.append(outcome(turn))
        log.info(
            "turn_forwarded",
            event_id=turn.event_id,
            turn=turn.turn,
            agent=turn.agent,
            committed=isinstance(turn, TurnCommitted),
            writes=len(commands) - 1,
            partition=partition,
            offset=offset,
        )
        return [Out(COMMANDS.name, COMMANDS.key_bytes(c), encode(c)) for c in commands]
