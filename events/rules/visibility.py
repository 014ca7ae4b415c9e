"""Which records a caller may read: its readable scopes and the visibility of one record."""

from __future__ import annotations

from typing import Protocol

from events.config import AgentConfig
from events.record import MemoryRecord, Scope


class Reader(Protocol):
    """Who reads: the tenant and agent a key speaks for, its session, its member (user) and
    whether its turn is a preview."""

    tenant: str
    agent: str
    session: str | None
    user: str | None
    preview: bool


def readable_scopes(cfg: AgentConfig, session: str | None, user: str | None = None) -> tuple[str, ...]:
    scopes = []
    if "agent" in cfg.memory.scope.read:
        scopes.append(Scope.AGENT.value)
    if "session" in cfg.memory.scope.read and session:
        scopes.append(Scope.SESSION.value)
    if "user" in cfg.memory.scope.read and user:
        scopes.append(Scope.USER.value)
    return tuple(scopes)


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
