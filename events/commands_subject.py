"""Commands on a subject of memory, sent on `memlane.memory.commands` like any other (and
importable from `events.commands`, whose `Command` union holds them): a member's consent
granted or withdrawn, a member's memory on an agent erased, an agent, a member or a whole
tenant removed, a member or a tenant restored. Their rules: `events.rules.ledger.subject_commands`."""

from __future__ import annotations

from typing import Literal

from events.command_base import CommandBase


class GrantConsent(CommandBase):
    """The member (`user`) lets the agent keep and use memory about them."""

    type: Literal["GrantConsent"] = "GrantConsent"


class WithdrawConsent(CommandBase):
    """Stops new writes and injection for the member at once; deletes nothing."""

    type: Literal["WithdrawConsent"] = "WithdrawConsent"


class EraseSubject(CommandBase):
    """An operator erases a member's memory on one agent: every live user-scope record of
    `user` is tombstoned and the consent is withdrawn."""

    type: Literal["EraseSubject"] = "EraseSubject"


class RemoveAgent(CommandBase):
    """The agent is soft-deleted: its memory is never served again, and no write is accepted."""

    type: Literal["RemoveAgent"] = "RemoveAgent"


class RemoveUser(CommandBase):
    """The member (`user`) leaves the tenant: sent under the workspace agent, as it holds for
    every agent; none serves that member's memory until they are restored. `erase`: the user is
    deleted, and their memory wiped at once on every agent, consent included; without it the
    member is only removed from the tenant and their facts are kept."""

    type: Literal["RemoveUser"] = "RemoveUser"
    erase: bool = True


class RemoveTenant(CommandBase):
    """The whole tenant is deleted: sent under the workspace agent; every agent's keys are
    destroyed and every projection purges the tenant (docs/features/encryption-and-erasure.md)."""

    type: Literal["RemoveTenant"] = "RemoveTenant"


class RestoreUser(CommandBase):
    """An operator restores a removed member (`user`), under the workspace agent: until then no
    key is issued to them and no consent of theirs is granted. What was erased stays erased."""

    type: Literal["RestoreUser"] = "RestoreUser"


class RestoreTenant(CommandBase):
    """The deployment's operator restores a removed tenant, under its workspace agent: until
    then no key is issued in it. What was erased stays erased."""

    type: Literal["RestoreTenant"] = "RestoreTenant"
