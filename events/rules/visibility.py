"""Which records a caller may read: its readable scopes and the visibility of one record."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from events.config import AgentConfig
from events.record import MemoryRecord, Scope


class Reader(Protocol):
    """Who reads: the tenant and agent a key speaks for, its session, its member (user) and
    whether its turn is a preview."""

    # Read-only members, so that frozen dataclasses and properties satisfy the protocol too.
    @property
    def tenant(self) -> str: ...
    @property
    def agent(self) -> str: ...
    @property
    def session(self) -> str | None: ...
    @property
    def user(self) -> str | None: ...
    @property
    def preview(self) -> bool: ...


def readable_scopes(cfg: AgentConfig, session: str | None, user: str | None = None) -> tuple[str, ...]:
    scopes = []
    if "agent" in cfg.memory.scope.read:
        scopes.append(Scope.AGENT.value)
    if "session" in cfg.memory.scope.read and session:
        scopes.append(Scope.SESSION.value)
    if "user" in cfg.memory.scope.read and user:
        scopes.append(Scope.USER.value)
    return tuple(scopes)


def default_scope(write: Sequence[str], session: str | None, user: str | None) -> Scope:
    """The scope of a write that names none, given the scopes the caller may write (`write`).

    A member's facts are theirs: USER when a user is named and user scope is writable, so
    they never land in session scope, where an operator reads them. Else SESSION when
    session scope is writable, whether or not a session is given: a write without one is
    refused for want of it ("session scope requires a session"), never widened to the whole
    agent. Else AGENT, else USER, refused for want of a user.

    The ledger passes `memory.scope.write`; extraction passes only the scopes its turn can
    fill (`extraction_review.allowed_scopes`: no session scope for a turn without a session),
    so the two agree on every write both could make. `session` does not change the choice
    (see above); it is taken so that every caller states the write's session and member alike.
    """
    if user and "user" in write:
        return Scope.USER
    if "session" in write:
        return Scope.SESSION
    if "agent" in write:
        return Scope.AGENT
    return Scope.USER


def visible(r: MemoryRecord, reader: Reader, scopes: tuple[str, ...] | None = None) -> bool:
    """A SESSION record is its session's, a USER record its member's: no one else reads
    either, whatever scopes the reader asks for."""
    if r.tenant != reader.tenant or r.agent != reader.agent:
        return False
    if r.scope is Scope.SESSION and r.session != reader.session:
        return False
    if r.scope is Scope.USER and (r.user is None or r.user != reader.user):
        return False
    if scopes is not None and r.scope.value not in scopes:
        return False
    return reader.preview or not r.preview
