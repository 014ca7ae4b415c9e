"""Detects tenant convention candidates (docs/features/tenant-platform-memory.md): the same fact
established in two or more agents of one tenant.

It reads `memlane.memory.events` in a consumer group of its own and acts on `RecordAdded` events
of facts that count (`events.rules.conventions.qualifies`: agent scope, live, no member, no
preview). Per (tenant, fact key) a Redis set holds the agents seen establishing the fact; once it
holds two or more, a `ProposeConvention` goes to the tenant's workspace partition of the ledger,
which keeps the candidate and its status. A restatement merged into a live record (`merged`) is
the same agent again and is skipped.

Idempotent on replay: SADD adds an agent once, and the proposal is sent again whenever the set
holds two or more (a crash between the set and the commit loses nothing); its id names the
tenant, the key and the number of agents, and the ledger ignores a proposal it holds already.
The sets hold ids and a hash of the fact's words, never its text; a removed tenant's sets go
(`SubjectErased`, tenant-wide), and a removed agent leaves every set of its tenant, so it no
longer counts toward a candidate (a candidate made before keeps its text: it is the tenant's,
and an administrator rejects it to withdraw it). It runs inside the ledger's process (`services.bootstrap.COMPANIONS`):
a Redis round trip per fact written, not worth a process of its own.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import structlog

from events.codec import Codec
from events.lean import decode_lean
from events.rules import conventions as rules
from events.topics import COMMANDS, EVENTS
from projections.redis.connection import Connect, tagged
from workers.runtime.runner import Out, Processor

log = structlog.get_logger()


class ConventionsProcessor(Processor):
    name = "conventions"
    sources = (EVENTS.name,)
    transactional = True  # a proposal commits with the offset of the fact that made it

    def __init__(self, settings, redis: Connect, *, codec: Codec) -> None:
        super().__init__(settings, codec=codec)
        self.redis = redis
        self.r: Any = None
        self.root = settings.redis_root
        self.tally: Counter[str] = Counter()

    async def start(self) -> None:
        self.r = self.redis(pooled=True)

    async def stop(self) -> None:
        if self.r is not None:
            await self.r.aclose()

    def decode(self, source: str, data: bytes) -> Any:
        """A removal, a new record that counts toward a convention (opened), or None: the rest
        is skipped, decoded lean at most (most fields never leave the bytes)."""
        if b'"RecordAdded"' not in data and b'"SubjectErased"' not in data:
            return None
        e = decode_lean(data)
        if e.type == "SubjectErased":
            return e
        if e.type == "RecordAdded" and e.record is not None and not e.merged and rules.qualifies(e.record, e.agent):
            e.record = e.record.opened(self.codec.cipher)
            return e
        return None

    def _keys(self, tenant: str, key: str) -> tuple[str, str]:
        tag = tagged(tenant)  # one slot per tenant: the set and the tenant's index change together
        return f"{self.root}conv:{tag}:{key}", f"{self.root}convkeys:{tag}"

    async def process(self, source: str, partition: int, offset: int, e: Any) -> list[Out]:
        if e is None:
            return []
        if e.type == "SubjectErased":
            if e.tenant_wide:
                await self._forget(e.tenant)
            elif e.user is None:  # an agent's removal (a member's erasure leaves agents counted)
                await self._forget_agent(e.tenant, e.agent)
            return []
        key = rules.fact_key(e.record.summary, e.record.content)
        if key is None:
            return []
        agents_key, index = self._keys(e.tenant, key)
        pipe = self.r.pipeline(transaction=True)
        pipe.sadd(index, key)
        pipe.sadd(agents_key, e.agent)
        pipe.smembers(agents_key)
        *_, agents = await pipe.execute()
        self.tally["facts"] += 1
        if len(agents) < 2:
            return []
        cmd = rules.propose(e.tenant, key, e.record.summary, set(agents), e.occurred_at)
        self.tally["proposals"] += 1
        return [Out(COMMANDS.name, COMMANDS.key_bytes(cmd), self.codec.encode(cmd))]

    async def _forget(self, tenant: str) -> None:
        _, index = self._keys(tenant, "")
        keys = await self.r.smembers(index)
        names = [self._keys(tenant, k)[0] for k in keys]
        for i in range(0, len(names), 500):
            await self.r.delete(*names[i:i + 500])
        await self.r.delete(index)

    async def _forget_agent(self, tenant: str, agent: str) -> None:
        _, index = self._keys(tenant, "")
        names = [self._keys(tenant, k)[0] for k in await self.r.smembers(index)]
        for i in range(0, len(names), 500):
            pipe = self.r.pipeline(transaction=False)
            for name in names[i:i + 500]:
                pipe.srem(name, agent)
            await pipe.execute()

    async def batch_done(self) -> list[Out]:
        if self.tally:
            log.info("conventions_seen", **self.tally)  # counts only: no fact's text in a log line
            self.tally = Counter()
        return []
