"""API keys' Redis view, a projection of `memlane.apikeys` (docs/features/api-keys.md). Under the
deployment's root (`ml:<topic prefix>`):

- `apikey:<digest>`: the key's public entry while it works, the entry with `revoked` after.
  A revocation is written as a value, not a delete, so that nothing that writes a working
  key (an issue, a follower, a restore) ever brings back a revoked one: working entries are
  only ever written where the name is free (SET NX), revocations over anything.
- `apikeys:<tenant>`: the tenant's working keys by id (entry and digest), for listing and
  revoking.
- `apikeys-view`: "ok" once the view holds everything the log did when it was restored;
  missing (Redis lost its data) or "restoring", a follower restores it.

A key and its index entry change in one MULTI/EXEC on one Redis server. On a Redis Cluster
they are in different slots (a key is looked up by its digest alone, before its tenant is
known), so they change one after the other, in the order that never leaves a working key
out of its tenant's index: the entry goes in before the key and comes out after it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from events.api_keys import KeyRecord
from projections.redis.connection import scan_keys, write_then

RESTORING, RESTORED = "restoring", "ok"
PAGE = 1000  # commands per pipeline when restoring


class ApiKeyView:
    def __init__(self, client: Any, root: str = "ml:") -> None:
        self.r = client
        self.root = root
        self.marker = f"{root}apikeys-view"

    def key(self, digest: str) -> str:
        return f"{self.root}apikey:{digest}"

    def index(self, tenant: str) -> str:
        return f"{self.root}apikeys:{tenant}"

    async def get(self, digest: str) -> dict[str, Any] | None:
        raw = await self.r.get(self.key(digest))
        return json.loads(raw) if raw else None

    async def rows(self, tenant: str) -> dict[str, dict[str, Any]]:
        """The tenant's index: id -> entry with its digest (`hash`)."""
        return {k if isinstance(k, str) else k.decode(): json.loads(v)
                for k, v in (await self.r.hgetall(self.index(tenant))).items()}

    async def row(self, tenant: str, kid: str) -> dict[str, Any] | None:
        raw = await self.r.hget(self.index(tenant), kid)
        return json.loads(raw) if raw is not None else None

    def _writes(self, p: Any, rec: KeyRecord) -> None:
        """`rec`'s writes, index and key in the order the module's docstring gives, on `p`."""
        if rec.revoked is None:
            p.hset(self.index(rec.tenant), rec.id, json.dumps({**rec.entry, "hash": rec.digest}))
            p.set(self.key(rec.digest), json.dumps(dict(rec.entry)), nx=True)
        else:
            p.set(self.key(rec.digest), json.dumps({**rec.entry, "revoked": rec.revoked}))
            p.hdel(self.index(rec.tenant), rec.id)

    async def put(self, rec: KeyRecord) -> None:
        if rec.revoked is None:
            await write_then(self.r, lambda p: p.hset(self.index(rec.tenant), rec.id,
                                                      json.dumps({**rec.entry, "hash": rec.digest})),
                             lambda p: p.set(self.key(rec.digest), json.dumps(dict(rec.entry)), nx=True))
        else:
            await write_then(self.r, lambda p: p.set(self.key(rec.digest), json.dumps({**rec.entry, "revoked": rec.revoked})),
                             lambda p: p.hdel(self.index(rec.tenant), rec.id))

    async def put_all(self, recs: Iterable[KeyRecord]) -> int:
        """Every record of `recs` written, pipelined a page at a time (each record's own two
        writes in order); how many."""
        n = 0
        p = self.r.pipeline(transaction=False)
        for rec in recs:
            self._writes(p, rec)
            n += 1
            if len(p) >= PAGE:
                await p.execute()
                p = self.r.pipeline(transaction=False)
        if len(p):
            await p.execute()
        return n

    async def restored(self) -> bool:
        raw = await self.r.get(self.marker)
        return (raw.decode() if isinstance(raw, bytes) else raw) == RESTORED

    async def restore(self, recs: Callable[[], Iterable[KeyRecord]]) -> int:
        """Writes every record `recs()` gives and marks the view restored. The mark is set only
        where "restoring" still stands (SET XX), so Redis losing its data again mid-way leaves
        no mark, and the next check restores once more. Returns how many records it wrote."""
        while True:
            await self.r.set(self.marker, RESTORING)
            n = await self.put_all(recs())
            if await self.r.set(self.marker, RESTORED, xx=True):
                return n

    async def unknown(self, known: Callable[[str], bool]) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Keys in Redis that `known(digest)` says the log does not hold, with their entries: those
        issued before keys went to the log."""
        prefix = self.key("")
        async for name in scan_keys(self.r, f"{prefix}*"):
            digest = name.removeprefix(prefix)
            if known(digest):
                continue
            entry = await self.get(digest)
            if entry is not None:
                yield digest, entry
