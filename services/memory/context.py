"""Who is asking, from where: what every memory call is given."""

from __future__ import annotations

from dataclasses import dataclass

from services.auth import Principal


@dataclass(frozen=True)
class Context:
    """Who is asking, from where: the key's principal plus the turn it speaks for."""

    principal: Principal
    agent: str
    session: str | None = None
    preview: bool = False
    turn_ref: str | None = None
    execution_id: str | None = None
    turn: int | None = None
    # The invocation of the execution and the agent version the call came from (X-Invocation,
    # X-Agent-Version), kept in a write's provenance as a turn's tool writes keep theirs.
    invocation: int | None = None
    agent_version: int | None = None
    # The member the call speaks for (X-User, or a member key's own): the subject of user-scope memory.
    user: str | None = None
    channel: str | None = None  # the session's channel (X-Channel)

    @property
    def tenant(self) -> str:
        return self.principal.tenant
