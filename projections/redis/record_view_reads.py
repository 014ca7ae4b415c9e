"""The record view's reads: records and their versions, listings, blocks, configuration and
subjects, from the generation reads are served from. Reads open what they return, skipping
(and counting) what was sealed under a destroyed key."""

from __future__ import annotations

from typing import Any

from events.codec import Codec
from events.config import AgentConfig
from events.record import MemoryRecord, Status
from events.rules.subjects import SubjectState
from projections.records import Keys, Page, decode_cursor, encode_cursor, opening, with_usage
from projections.redis.connection import scan_page
from projections.redis.record_view_generations import Generations
from projections.redis.record_view_keys import PAGE, REMOVED_TENANTS, agent_key, tagged_agents, user_list_key
from projections.redis.record_view_stored import lean_record, made, open_block, snapshot

LIST_PAGE = 2000  # ids per ZRANGE when a reader walks a whole listing


class RecordReads:
    def __init__(self, client: Any, gens: Generations, keys: Keys | None, codec: Codec) -> None:
        self.r = client
        self.gens = gens
        self.codec = codec  # opens the sealed versions and block texts
        # Catches up on a key not known yet, and publishes the keys a write seals under
        # first. Without it a key not known yet is the caller's to catch up on (KeyMissing).
        self.keys = keys
        self.unreadable = 0  # versions and blocks skipped: sealed under destroyed keys

    # ------------------------------------------------------------------ opening

    async def open_counted(self, fn: Any, *args: Any) -> Any:
        """`fn(*args)`, or None (counted) for what was sealed under a destroyed key."""
        out = await opening(self.keys, fn, *args)
        if out is None:
            self.unreadable += 1
        return out

    async def _snapshots(self, raws: list[str | None]) -> list[MemoryRecord]:
        out = []
        for raw in raws:
            if raw and (r := await self.open_counted(snapshot, raw, self.codec)) is not None:
                out.append(r)
        return out

    # ------------------------------------------------------------------ keys of a generation

    async def _read_generation(self) -> int:
        return await self.gens.for_reads()

    def _ns(self, gen: int) -> str:
        return self.gens.ns(gen)

    async def namespace(self) -> str:
        """The key namespace of the generation reads are served from (`ViewStore`)."""
        return self._ns(await self._read_generation())

    def _keys(self, gen: int, tenant: str, agent: str) -> list[str]:
        ns, ak = self._ns(gen), f"{tenant}/{agent}"
        return [agent_key(ns, "rec", ak), agent_key(ns, "list", ak), agent_key(ns, "pinned", ak), f"{ns}:ckpt"]

    def _user_list(self, gen: int, tenant: str, agent: str, user: str) -> str:
        """The member's listing of their USER records."""
        return user_list_key(self._ns(gen), f"{tenant}/{agent}", user)

    def _agent(self, gen: int, kind: str, tenant: str, agent: str) -> str:
        return agent_key(self._ns(gen), kind, f"{tenant}/{agent}")

    # ------------------------------------------------------------------ reconciler's reads

    async def scan_agents(self, gen: int, cursor: int, count: int) -> tuple[int, list[tuple[str, str]]]:
        """One SCAN page of the (tenant, agent) pairs that have records in generation `gen`:
        the next cursor (0 when done) and the pairs."""
        prefix = f"{self._ns(gen)}:rec:{{"
        cursor, keys = await scan_page(self.r, cursor, f"{prefix}*", count)
        out = []
        for k in keys:
            tenant, _, agent = k[len(prefix):-1].partition("/")
            out.append((tenant, agent))
        return cursor, out

    async def listing(self, gen: int, tenant: str, agent: str, part: str) -> tuple[int, list[str]]:
        """The view's checkpoint of `part` and the agent's listed record ids, the checkpoint
        first: the view read after it is at least that new."""
        rec_key, list_key, _, ckpt_key = self._keys(gen, tenant, agent)
        view_at = await self.r.hget(ckpt_key, part)
        # Pages, not one ZRANGE: an agent's list can hold 100,000 ids, and one call that large
        # holds Redis (single-threaded) for every other caller.
        ids: list[str] = []
        while True:
            page = await self.r.zrange(list_key, len(ids), len(ids) + LIST_PAGE - 1)
            ids += page
            if len(page) < LIST_PAGE:
                return int(view_at or 0), ids

    async def current_raw(self, gen: int, tenant: str, agent: str, ids: list[str]) -> list[str]:
        """The stored JSON of the current version of each of `ids` the view holds, undecoded
        (a caller decoding thousands does so off the event loop)."""
        if not ids:
            return []
        rec_key = self._keys(gen, tenant, agent)[0]
        versions = await self.r.hmget(rec_key, ids)
        fields = [f"{rid}#{v}" for rid, v in zip(ids, versions, strict=True) if v is not None]
        raws = await self.r.hmget(rec_key, fields) if fields else []
        return [raw for raw in raws if raw is not None]

    async def shadowed_in(self, gen: int, tenant: str, agent: str) -> set[str]:
        """`shadowed` in a given generation."""
        return await self.r.smembers(self._agent(gen, "shadowed", tenant, agent))

    # ------------------------------------------------------------------ records

    async def get(self, tenant, agent, rid, version=None) -> MemoryRecord | None:
        if version is None:
            found = await self.get_many(tenant, agent, [rid])
            return found[0] if found else None
        key = self._keys(await self._read_generation(), tenant, agent)[0]
        raw = await self.r.hget(key, f"{rid}#{version}")
        return await self.open_counted(snapshot, raw, self.codec) if raw else None

    async def get_many(self, tenant, agent, rids: list[str]) -> list[MemoryRecord]:
        """Current versions of `rids`, in order, skipping unknown ids and records sealed under
        destroyed keys: two round trips in all."""
        if not rids:
            return []
        gen = await self._read_generation()
        key = self._keys(gen, tenant, agent)[0]
        pipe = self.r.pipeline(transaction=False)
        pipe.hmget(key, rids)
        pipe.hmget(self._agent(gen, "usage", tenant, agent), rids)  # the usage counts (docs/features/trust.md)
        currents, counts = await pipe.execute()
        fields = [f"{rid}#{cur}" for rid, cur in zip(rids, currents) if cur is not None]
        raws = await self.r.hmget(key, fields) if fields else []
        used = {rid: int(n) for rid, n in zip(rids, counts) if n is not None}
        return [with_usage(r, used.get(r.id, 0)) for r in await self._snapshots(raws)]

    async def history(self, tenant, agent, rid) -> list[MemoryRecord]:
        """Every version, newest first: versions count up from 1."""
        key = self._keys(await self._read_generation(), tenant, agent)[0]
        cur = await self.r.hget(key, rid)
        if cur is None:
            return []
        raws = await self.r.hmget(key, [f"{rid}#{v}" for v in range(int(cur), 0, -1)])
        return await self._snapshots(raws)

    async def every_version(self, tenant: str, agent: str) -> dict[str, list[tuple[str, MemoryRecord]]]:
        """Every version of every record of the agent, each with the command that made it, by
        record id: for an undo's plan. Reads all the agent holds; versions sealed under destroyed
        keys are left out."""
        key = self._keys(await self._read_generation(), tenant, agent)[0]
        out: dict[str, list[tuple[str, MemoryRecord]]] = {}
        async for field, raw in self.r.hscan_iter(key, count=1000):
            if "#" in field and (got := await self.open_counted(made, raw, self.codec)) is not None:
                out.setdefault(got[1].id, []).append(got)
        return out

    async def page(self, tenant, agent, limit, after=None, ascending=False, user=None) -> Page:
        """A page of the agent's listing, or with `user` of that member's (their USER
        records), by creation time."""
        gen = await self._read_generation()
        key = self._keys(gen, tenant, agent)[1] if user is None else self._user_list(gen, tenant, agent, user)
        cur = decode_cursor(after) if after else None
        picked: list[tuple[float, str]] = []
        offset, chunk = 0, limit + 16
        while len(picked) <= limit:
            if ascending:
                lo = cur[0] if cur else "-inf"
                rows = await self.r.zrangebyscore(key, lo, "+inf", start=offset, num=chunk, withscores=True)
            else:
                hi = cur[0] if cur else "+inf"
                rows = await self.r.zrevrangebyscore(key, hi, "-inf", start=offset, num=chunk, withscores=True)
            if not rows:
                break
            for rid, score in rows:
                if cur and ((score, rid) <= cur if ascending else (score, rid) >= cur):
                    continue
                picked.append((score, rid))
            offset += len(rows)
        picked = picked[: limit + 1]
        records = await self.get_many(tenant, agent, [rid for _, rid in picked[:limit]])
        nxt = encode_cursor(*picked[limit - 1]) if len(picked) > limit else None
        return Page(records, nxt)

    async def pinned(self, tenant, agent) -> list[MemoryRecord]:
        key = self._keys(await self._read_generation(), tenant, agent)[2]
        rids = await self.r.zrange(key, 0, -1)
        return [r for r in await self.get_many(tenant, agent, rids) if r.pinned and r.status is Status.ACTIVE]

    async def shadowed(self, tenant, agent) -> set[str]:
        """Live records a preview record replaces or deletes: preview turns skip them."""
        return await self.r.smembers(self._agent(await self._read_generation(), "shadowed", tenant, agent))

    async def expired(self, at_ms: int) -> dict[tuple[str, str], list[str]]:
        """Live records whose expiry is at or before `at_ms`, by (tenant, agent): what a
        sweep asks the ledger to tombstone. Each agent's expiring records are in its own
        slot; `expiring` names the agents to look at."""
        out: dict[tuple[str, str], list[str]] = {}
        ns = self._ns(await self._read_generation())
        agents = sorted(await self.r.smembers(f"{ns}:expiring"))
        for i in range(0, len(agents), PAGE):
            chunk = agents[i:i + PAGE]
            async with self.r.pipeline(transaction=False) as p:
                for ak in chunk:
                    p.zrangebyscore(agent_key(ns, "expiry", ak), "-inf", at_ms)
                found = await p.execute()
            for ak, rids in zip(chunk, found):
                if rids:
                    tenant, _, agent = ak.partition("/")
                    out[(tenant, agent)] = list(rids)
        return out

    # ------------------------------------------------------------------ agents and members

    async def agents(self, tenant: str) -> list[str]:
        """The tenant's configured agents: a SCAN of the view, for an operator's page, not a hot path."""
        return sorted(await tagged_agents(self.r, self._ns(await self._read_generation()), "config", tenant))

    async def census(self, tenant: str, agent: str) -> dict[tuple[str, str, str], int]:
        """How many of the agent's records are in each (status, kind, scope), by their current
        versions; never a record's text (ids, statuses and kinds are stored unsealed)."""
        rec_key = self._keys(await self._read_generation(), tenant, agent)[0]
        latest: dict[str, tuple[int, str]] = {}
        async for field, raw in self.r.hscan_iter(rec_key, match="*#*", count=PAGE):
            rid, _, v = field.rpartition("#")
            if v.isdigit() and int(v) > latest.get(rid, (0, ""))[0]:
                latest[rid] = (int(v), raw)
        counts: dict[tuple[str, str, str], int] = {}
        for _, raw in latest.values():
            if (r := lean_record(raw)) is not None:
                k = (r.status.value, r.kind, r.scope.value)
                counts[k] = counts.get(k, 0) + 1
        return counts

    async def users(self, tenant: str, agent: str) -> set[str]:
        """The members who have (or had) USER records on the agent."""
        return await self.r.smembers(self._agent(await self._read_generation(), "users", tenant, agent))

    async def blocks(self, tenant, agent) -> dict[str, str]:
        """The agent's memory blocks, label -> text (opened; one sealed under a destroyed key is left out).
        An application's blocks are here too, under `<application>:<label>` (`events.commands.block_field`)."""
        stored = await self.r.hgetall(self._agent(await self._read_generation(), "blocks", tenant, agent))
        out = {}
        for label, value in stored.items():
            if (text := await self.open_counted(open_block, self.codec.cipher, tenant, agent, label, value)) is not None:
                out[label] = text
        return out

    async def config(self, tenant: str, agent: str) -> AgentConfig | None:
        raw = await self.r.get(self._agent(await self._read_generation(), "config", tenant, agent))
        return AgentConfig.model_validate_json(raw) if raw else None

    async def subject(self, tenant: str, agent: str, user: str | None) -> SubjectState:
        """The member's consent on the agent, and whether the agent or the member was removed:
        one round trip."""
        ns = self._ns(await self._read_generation())
        pipe = self.r.pipeline(transaction=False)
        pipe.sismember(f"{ns}:removed_agents:{tenant}", agent)
        pipe.sismember(f"{ns}:{REMOVED_TENANTS}", tenant)
        if user is not None:
            pipe.hget(agent_key(ns, "consent", f"{tenant}/{agent}"), user)
            pipe.sismember(f"{ns}:removed_users:{tenant}", user)
        got = await pipe.execute()
        if user is None:
            return SubjectState(agent_removed=bool(got[0]), tenant_removed=bool(got[1]))
        return SubjectState(consent=got[2], agent_removed=bool(got[0]), user_removed=bool(got[3]),
                            tenant_removed=bool(got[1]))

    async def consents(self, tenant: str, agent: str) -> dict[str, str]:
        """Every member's consent on the agent: user -> granted | withdrawn."""
        return await self.r.hgetall(self._agent(await self._read_generation(), "consent", tenant, agent))
