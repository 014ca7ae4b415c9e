"""The record view's generations: each is a key namespace `<root>g<N>`, and `<root>generation`
names the one readers use, so a rebuild fills a new generation and switches over at once."""

from __future__ import annotations

import time
from typing import Any

from projections.redis.connection import is_cluster, scan_keys, unlink_keys

READ_GENERATION_TTL_S = 1.0

# One SCAN page of a pattern, unlinked where it is found. ARGV: cursor, pattern. One
# server only: its UNLINKs span slots, so a cluster drops a generation key by key
# (`Generations.drop`).
DROP_PAGE = """
local page = redis.call('SCAN', ARGV[1], 'MATCH', ARGV[2], 'COUNT', 10000)
local keys = page[2]
for j = 1, #keys, 4000 do redis.call('UNLINK', unpack(keys, j, math.min(j + 3999, #keys))) end
return {page[1], #keys}
"""


class Generations:
    """Which generation writes and reads use, the registry of those that hold events, and
    dropping one. `fixed` pins every lookup to one generation (a rebuild's, a test's)."""

    def __init__(self, client: Any, root: str, fixed: int | None = None) -> None:
        self.r = client
        self.root = root
        self.fixed = fixed
        self._drop_page = client.register_script(DROP_PAGE)
        self._registered: set[int] = set()
        self._read_gen: tuple[int, float] | None = None

    def ns(self, gen: int) -> str:
        return f"{self.root}g{gen}"

    async def current(self) -> int:
        if self.fixed is not None:
            return self.fixed
        g = await self.r.get(f"{self.root}generation")
        return int(g) if g else 1

    async def for_reads(self) -> int:
        """The generation reads use, looked up at most once a second: a read saves a round
        trip, and after a switch the previous generation is kept, so reading it for a
        moment longer is safe. Writes always look it up (`current`)."""
        now = time.monotonic()
        if self._read_gen is None or now - self._read_gen[1] > READ_GENERATION_TTL_S:
            self._read_gen = (await self.current(), now)
        return self._read_gen[0]

    async def switch(self, gen: int) -> None:
        await self.r.set(f"{self.root}generation", gen)

    async def held(self) -> list[int]:
        """Generations that hold events, ascending. A registry, not a SCAN: scanning walks
        every key in the database, other deployments' too."""
        return sorted(int(g) for g in await self.r.smembers(f"{self.root}generations"))

    async def register(self) -> str:
        """The namespace writes go to, its generation entered in the registry once."""
        gen = await self.current()
        if gen not in self._registered:
            await self.r.sadd(f"{self.root}generations", gen)
            self._registered.add(gen)
        return self.ns(gen)

    async def checkpoints(self, gen: int | None = None) -> dict[str, int]:
        gen = gen if gen is not None else await self.current()
        raw = await self.r.hgetall(f"{self.ns(gen)}:ckpt")
        return {k: int(v) for k, v in raw.items()}

    async def drop(self, gen: int) -> int:
        """Delete a generation's keys a scan page at a time, so Redis keeps serving
        meanwhile; on one server the keys never travel to this process. A cluster's
        keys span slots and nodes, which one script cannot, so there each primary's
        SCAN pages come here and go back as an UNLINK per slot."""
        await self.r.srem(f"{self.root}generations", gen)
        if is_cluster(self.r):
            dropped, doomed = 0, []
            async for k in scan_keys(self.r, f"{self.ns(gen)}:*", count=10_000):
                doomed.append(k)
                if len(doomed) >= 10_000:
                    dropped += await unlink_keys(self.r, doomed)
                    doomed = []
            return dropped + await unlink_keys(self.r, doomed)
        dropped, cursor = 0, "0"
        while True:
            cursor, n = await self._drop_page(args=[cursor, f"{self.ns(gen)}:*"])
            dropped += n
            if cursor == "0":
                return dropped
