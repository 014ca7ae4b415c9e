"""What agent platforms emit on `memlane.turns`."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import Field

from events.base import Ident, Message_, RunId

MAX_MESSAGE_CHARS = 200_000
MAX_MESSAGES_PER_TURN = 500


class ToolCall(Message_):
    id: Ident
    name: Annotated[str, Field(min_length=1, max_length=128)]
    arguments: dict[str, Any] = {}


class Message(Message_):
    id: Ident
    role: Literal["system", "user", "assistant", "tool"]
    content: Annotated[str, Field(max_length=MAX_MESSAGE_CHARS)] = ""
    tool_calls: list[ToolCall] = []
    # Set on role "tool": which call this result answers, and whether it failed.
    tool_call_id: Ident | None = None
    tool_name: str | None = None
    is_error: bool = False
    # Skill loads and the agent's own memory retrievals are never kept in history.
    origin: Literal["conversation", "skill_load", "retrieval"] = "conversation"


# Where a session runs. Memory is read and written only in the channels an agent's
# `memory.channels` lists; a turn that names none is a platform without channels.
CHANNEL_PATTERN = r"^[A-Za-z0-9_\-]+$"
Channel = Annotated[str, Field(min_length=1, max_length=64, pattern=CHANNEL_PATTERN)]


class _TurnBase(Message_):
    event_id: Ident
    tenant: Ident
    agent: Ident
    session: Ident | None = None
    # The member the session belongs to (the platform's createdById, or an API key's owner):
    # with the tenant and agent, the subject of user-scope memory. None for platforms without users.
    user: Ident | None = None
    # The platform's own end user of that key (the platform's endUserId): kept, never splits memory.
    end_user: Ident | None = None
    channel: Channel | None = None
    turn: Annotated[int, Field(ge=0)]
    attempt: Annotated[int, Field(ge=1)] = 1
    execution_id: Ident
    invocation: Annotated[int, Field(ge=0)] = 0
    agent_version: Annotated[int, Field(ge=0)] = 0
    preview: bool = False
    occurred_at: datetime

    def provenance(self, source: Any) -> Any:
        """Provenance of a change this turn caused (`source` is an events.record.Source)."""
        from events.record import Provenance

        return Provenance(
            source=source,
            execution_id=self.execution_id,
            invocation=self.invocation,
            agent_version=self.agent_version,
            session=self.session,
            user=self.user,
            turn=self.turn,
            modified_by=f"agent:{self.agent}",
        )

    @property
    def turn_ref(self) -> str:
        """Identifies one attempt of one turn: writes made during it wait on its outcome."""
        return f"{self.execution_id}:{self.turn}:{self.attempt}"


class TurnCommitted(_TurnBase):
    type: Literal["TurnCommitted"] = "TurnCommitted"
    # How the turn ended: only a completed turn is reviewed for facts.
    status: Literal["completed", "failed", "stopped", "output_restricted"] = "completed"
    messages: Annotated[list[Message], Field(max_length=MAX_MESSAGES_PER_TURN)] = []


class TurnRolledBack(_TurnBase):
    type: Literal["TurnRolledBack"] = "TurnRolledBack"
    reason: Annotated[str, Field(max_length=1024)] = ""


class SessionEnded(Message_):
    type: Literal["SessionEnded"] = "SessionEnded"
    event_id: Ident
    tenant: Ident
    agent: Ident
    session: Ident | None = None
    user: Ident | None = None  # the session's member, as on its turns
    channel: Channel | None = None
    execution_id: Ident | None = None
    outcome: Literal["successful", "failed", "uncertain"] = "uncertain"
    occurred_at: datetime
    # The run (session memory) that ended with the session: consolidation distils its entries too,
    # each one an event of the episode.
    run: RunId | None = None


class MembershipChanged(Message_):
    """The agent joined or left a group conversation (a session). History then finds only what
    was said while it was a member; a session with no such event is one the agent
    always belonged to (the 1:1 case). Keyed like the session's turns, so it is ordered with them."""

    type: Literal["MembershipChanged"] = "MembershipChanged"
    event_id: Ident
    tenant: Ident
    agent: Ident
    session: Ident
    joined: bool
    occurred_at: datetime


class MessageDeleted(Message_):
    """The platform (or an operator) deleted a message of a session: history keeps it no more,
    so no search finds it and a note citing it is left out. Keyed like the session's turns, so
    it follows the turn that said it, in a replay too."""

    type: Literal["MessageDeleted"] = "MessageDeleted"
    event_id: Ident
    tenant: Ident
    agent: Ident
    session: Ident
    message_id: Annotated[str, Field(min_length=1, max_length=256)]
    occurred_at: datetime


TurnEvent = Annotated[TurnCommitted | TurnRolledBack | SessionEnded | MembershipChanged | MessageDeleted,
                      Field(discriminator="type")]
