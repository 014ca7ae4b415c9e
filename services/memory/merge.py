"""The API's half of the near-duplicate merge (docs/features/near-duplicate-merge.md): before a direct
write is sent, its text is embedded and compared with the nearest live records of the same
agent, scope (session, member) and kind; when the rule of `events.rules.near_duplicate` says
the write restates one, the evidence goes on the command and the ledger merges it there
after checking again. The similarity is measured here because only the API holds the
embedder and the index; the ledger keeps what it decided, and why, in the event.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import structlog

from events.base import utcnow
from events.commands import AddMemory, MergeEvidence
from events.config import AgentConfig
from events.record import Scope, Source, Status
from events.rules import near_duplicate
from events.rules.visibility import default_scope
from projections.qdrant.index import SearchFilter

if TYPE_CHECKING:
    from projections.embedders.port import Embedder
    from projections.redis.record_view import RedisRecords
    from workers.followers.memory_shards import MemoryShards

log = structlog.get_logger()


def eligible(cmd: AddMemory) -> bool:
    """Whether a write may merge into another record at all. An agent's own tool write may; a
    write naming `replaces` (it changes a record it chose), a `key` (keyed facts conflict
    instead, so a disagreement is kept and shown), `pinned` (a pin is a deliberate new line in
    every recall), an `expected_version` (it asks to make a new record, or fails), a preview
    turn's (it must not touch live memory), an operator's or a member's (an edit says exactly
    what to keep) or a run entry that is no record yet never does. Writes the model's
    extraction makes go through its own review and are not checked here."""
    if cmd.replaces or cmd.key or cmd.pinned or cmd.preview or cmd.expected_version is not None:
        return False
    if cmd.run and cmd.scope is None:
        return False
    return cmd.provenance.source is Source.TOOL


def scope_of(cfg: AgentConfig, cmd: AddMemory) -> Scope | None:
    """The scope the ledger will give the write (`records._scope_for`), or None when it may not write it."""
    write = cfg.memory.scope.write
    scope = cmd.scope or default_scope(write, cmd.session, cmd.user)
    if scope.value.lower() not in write:
        return None
    if (scope is Scope.SESSION and not cmd.session) or (scope is Scope.USER and not cmd.user):
        return None
    return scope


class MergeCheck:
    def __init__(self, records: RedisRecords, embedder: Embedder) -> None:
        self.records = records
        self.embedder = embedder

    async def evidence(self, cmd: AddMemory, cfg: AgentConfig, memory: MemoryShards | None) -> MergeEvidence | None:
        """The merge evidence for `cmd`, or None. A failure to embed or search is logged and the
        write goes on unmerged: the check saves a duplicate, it must never cost a write."""
        if memory is None or not eligible(cmd) or (scope := scope_of(cfg, cmd)) is None:
            return None
        try:
            return await self._evidence(cmd, scope, memory)
        except Exception as e:  # noqa: BLE001 - any failure of the embedder, index or view
            log.warning("merge_check_failed", error=type(e).__name__, tenant=cmd.tenant, agent=cmd.agent)
            return None

    async def _evidence(self, cmd: AddMemory, scope: Scope, memory: MemoryShards) -> MergeEvidence | None:
        text = f"{cmd.summary}\n{cmd.content}".strip()
        vec = (await asyncio.to_thread(self.embedder.embed, [text]))[0]
        f = SearchFilter(
            tenant=cmd.tenant, agent=cmd.agent, scopes=(scope.value,),
            session=cmd.session if scope is Scope.SESSION else None, preview=False, kind=cmd.kind,
            user=cmd.user if scope is Scope.USER else None,
        )
        hits = await asyncio.to_thread(memory.search, f, vec, text, near_duplicate.CANDIDATES, "vector",
                                       near_duplicate.SIMILARITY_MIN)
        if not hits:
            return None
        found = {r.id: r for r in await self.records.get_many(cmd.tenant, cmd.agent, [h.record_id for h in hits])}
        now = utcnow()
        for h in hits:  # best first: the nearest record the rule accepts survives
            r = found.get(h.record_id)
            if r is None or r.status is not Status.ACTIVE or not r.in_force(now) or r.scope is not scope:
                continue
            if (ev := near_duplicate.evidence(r.id, text, r.text, h.score, cmd.issued_at - r.modified)) is not None:
                return ev
        return None
