"""What every command carries, whatever it asks: its id, tenant and agent, when it was issued
and by whom, the turn it waits for and the member it speaks for. Apart from `commands` so that
`commands_subject` builds on it too without the two importing each other."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import AfterValidator

from events.base import Ident, Message_
from events.limits import check_turn_ref, unless_stored
from events.record import Provenance

# Limited on commands, where a write enters, and not on records: a staged write decoded as
# stored keeps decoding whatever it holds (the other limits: `commands`).
TurnRef = Annotated[str | None, AfterValidator(unless_stored(check_turn_ref))]


class CommandBase(Message_):
    """The fields of every command; each command adds its `type` and what it asks."""

    command_id: Ident
    tenant: Ident
    agent: Ident
    issued_at: datetime
    provenance: Provenance = Provenance()
    # Set when the write happens inside a turn: it waits for that turn's outcome.
    turn_ref: TurnRef = None
    preview: bool = False
    # The member the command speaks for: the subject of user-scope records and of consent.
    user: Ident | None = None
