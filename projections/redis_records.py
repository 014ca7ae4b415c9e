"""Redis adapter of the record view.

Keys live under a generation namespace `ml:g<N>:`, and `ml:generation` points at the
one readers use, so a rebuild can fill a new generation and switch over atomically.
Every key of an agent carries the agent as a hash tag, `{<tenant>/<agent>}`, so an
agent's keys share one Redis Cluster slot and one script or MULTI/EXEC may touch them all
(`projections.redis_client`; docs/operations/redis-cluster.md). Generations written before hash tags
(before 2026-12-02) read as empty: rebuild.
An agent's records share one hash, `rec:{<tenant>/<agent>}`: field `<record id>` holds the
current version and `<record id>#<version>` each version. Per-record keys cost Redis
a key each to create, and dropping a generation had to scan and unlink every one.
Generations written with per-record keys (before 2026-11-29) read as empty: rebuild.
Besides the agent's listing `list:{<agent>}`, each member has a listing of their USER
records, `ulist:{<agent>}|<user>`, and `users:{<agent>}` names the members who have (had)
any: a member's list and an operator's counts read those, not the agent's whole listing.
A generation written before 2026-12-01 has neither for its records of then: there a
member's list and the operator's counts miss them (a member's list shows only records
written since, the counts only those and members with a consent state) until
`memlane rebuild` fills a new generation, which has them all.
Each agent's events of a batch are applied by one Lua script that checks the versions; on
one server the batch's scripts and the projection's checkpoint go in one MULTI/EXEC (the
tracking record lives with the view), on a cluster the checkpoint follows the agents'
scripts, which a replay applies again without changing anything. Expiring records are in
each agent's `expiry:{<agent>}`, and `expiring` names the agents that have (had) any.

No plaintext: a version is stored as the event's raw bytes, its personal fields sealed
(`events.sealing`), and a block's text sealed under its agent's key; reads open them,
skipping what was sealed under a destroyed key. A record sealed under a key that is
destroyed already is not stored at all. `SubjectErased` and `RecordsPurged` (`purge`)
drop what they name; a batch is applied up to each of them, then the purge, then on.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis.asyncio as aioredis
from pydantic import BaseModel, ConfigDict, TypeAdapter

from events.codec import ContractError, cipher, opened
from events.commands import block_field
from events.config import AgentConfig
from events.lean import LeanEvent, LeanRecord, as_lean, decode_lean
from events.record import LIVE, MemoryRecord, Scope, Status
from events.rules.subjects import SubjectState
from events.sealing import kid_of, open_text, seal_text, subject_of
from projections import redis_notes, redis_profiles, redis_runs, redis_shared
from projections.applied_waiter import AppliedListener
from projections.records import (
    Erasure,
    Keys,
    Page,
    decode_cursor,
    encode_cursor,
    listed,
    opening,
    sort_score,
    with_usage,
)
from projections.redis_client import agent_tag, is_cluster, scan_keys, scan_page, unlink_keys, write_then

# One call per agent of a batch, all its keys in one hash slot (the agent's tag), so it
# runs on a Redis Cluster too. KEYS: the agent's rec, list, pinned, shadowed, users and
# expiry keys (`_apply_keys`). ARGV[1]: the prefix of the agent's member listings; ARGV[2]:
# the channel to announce on, or "" (no one waits); ARGV[3]: the agent's applied block and
# subject changes as a JSON array (`applied_waiter.announcement`); ARGV[4]: the agent key (`tenant/agent`, for the announcement); then 8 arguments
# per event (`_row` but its agent key): record id, version, the event's raw JSON, sort
# score, flags (1 listed + 2 pinned), expiry ms of a live record or -1, the live record a
# preview record shadows or "", and the member of a USER record or "". A USER record is
# listed in its member's listing too, as in the agent's (its scope and member never change
# between versions), and its member joins the agent's set of members. Flat arguments, not
# one JSON document: decoding escaped snapshots in Lua cost more than the writes. The
# sorted-set changes go out as one ZADD and one ZREM per key, not a call per event. The
# checkpoint is CHECKPOINT's, after the batch's agents (`redis_client.write_then`).
APPLY = """
local rk, lk, pk, sk, uk, ek = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local ulist, ak = ARGV[1], ARGV[4]
local applied = 0
local changes = {}
local announce, announced = ARGV[2] ~= '', {}
local users, anyuser = {}, false
local function put(key, member, score)
  local t = changes[key]
  if not t then t = {}; changes[key] = t end
  t[member] = score
end
for i = 5, #ARGV, 8 do
  local rid, ver, user = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 7]
  local cur = tonumber(redis.call('HGET', rk, rid) or '0')
  if ARGV[i + 6] ~= '' then redis.call('SADD', sk, ARGV[i + 6]) end
  if user ~= '' then users[user] = true; anyuser = true end
  if ver > cur then
    redis.call('HSET', rk, rid .. '#' .. ver, ARGV[i + 2], rid, ver)
    local score, flags, expiry = ARGV[i + 3], tonumber(ARGV[i + 4]), ARGV[i + 5]
    -- A first version has no earlier listing, pin or expiry to take back.
    local later = cur > 0
    if flags % 2 == 1 then put(lk, rid, score)
    elseif later then put(lk, rid, false) end
    if user ~= '' then
      local ul = ulist .. user
      if flags % 2 == 1 then put(ul, rid, score)
      elseif later then put(ul, rid, false) end
    end
    if flags >= 2 then put(pk, rid, score)
    elseif later then put(pk, rid, false) end
    if expiry ~= '-1' then put(ek, rid, expiry)
    elseif later then put(ek, rid, false) end
    applied = applied + 1
    if announce then announced[#announced + 1] = {ak, rid, ver} end
  else
    redis.call('HSETNX', rk, rid .. '#' .. ver, ARGV[i + 2])
  end
end
for key, members in pairs(changes) do
  local add, rem = {}, {}
  for m, score in pairs(members) do
    if score then add[#add + 1] = score; add[#add + 1] = m else rem[#rem + 1] = m end
  end
  -- unpack() is bounded by Lua's stack: a few thousand arguments per call
  for j = 1, #add, 4000 do redis.call('ZADD', key, unpack(add, j, math.min(j + 3999, #add))) end
  for j = 1, #rem, 4000 do redis.call('ZREM', key, unpack(rem, j, math.min(j + 3999, #rem))) end
end
if anyuser then
  local add = {}
  for u in pairs(users) do add[#add + 1] = u end
  for j = 1, #add, 4000 do redis.call('SADD', uk, unpack(add, j, math.min(j + 3999, #add))) end
end
-- Published with the writes, so whoever hears of a version can read it.
if announce and (#announced > 0 or ARGV[3] ~= '[]') then
  local rows = '[]'
  if #announced > 0 then rows = cjson.encode(announced) end
  redis.call('PUBLISH', ARGV[2], '{"b":' .. ARGV[3] .. ',"r":' .. rows .. '}')
end
return applied
"""


# A `UsageRecorded`'s totals into the agent's `usage` hash, beside the versions: usage makes no
# version (docs/features/trust.md). KEYS[1]: the hash; ARGV: record id, total, ... A total only grows, so
# a redelivered older event changes nothing, as a version guard would.
USAGE = """
for i = 1, #ARGV, 2 do
  local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  if tonumber(ARGV[i + 1]) > cur then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
return 0
"""


def _usage_totals(into: dict[str, dict[str, int]], e: Any) -> None:
    """A `UsageRecorded`'s totals, by agent key, the largest of the batch kept."""
    mine = into.setdefault(f"{e.tenant}/{e.agent}", {})
    for rid, total in e.totals.items():
        mine[rid] = max(total, mine.get(rid, 0))


# The projection's checkpoint: KEYS[1] the generation's checkpoint hash; ARGV[1] a JSON
# object {checkpoint field: next offset}. A field only moves forward.
CHECKPOINT = """
for field, nxt in pairs(cjson.decode(ARGV[1])) do
  local cur = tonumber(redis.call('HGET', KEYS[1], field) or '-1')
  if nxt > cur then redis.call('HSET', KEYS[1], field, nxt) end
end
return 0
"""


# One SCAN page of a pattern, unlinked where it is found. ARGV: cursor, pattern. One
# server only: its UNLINKs span slots, so a cluster drops a generation key by key
# (`drop_generation`).
DROP_PAGE = """
local page = redis.call('SCAN', ARGV[1], 'MATCH', ARGV[2], 'COUNT', 10000)
local keys = page[2]
for j = 1, #keys, 4000 do redis.call('UNLINK', unpack(keys, j, math.min(j + 3999, #keys))) end
return {page[1], #keys}
"""


READ_GENERATION_TTL_S = 1.0
LIST_PAGE = 2000  # ids per ZRANGE when a reader walks a whole listing


def _checkpoints(positions: list[tuple[str, int]] | None) -> dict[str, int]:
    ckpt: dict[str, int] = {}
    for field, nxt in positions or ():
        ckpt[field] = max(nxt, ckpt.get(field, 0))
    return ckpt


SEALED_BLOCK = "sealed:"  # what starts a sealed block text in the view
PURGE_EVENTS = ("SubjectErased", "RecordsPurged")
PAGE = 1000  # keys, fields or members per SCAN page and per write when a purge walks a key


def block_aad(tenant: str, agent: str, label: str) -> str:
    """A sealed block text is bound to its agent and label: it cannot be moved to another."""
    return f"block:{tenant}/{agent}/{label}"


def seal_block(tenant: str, agent: str, label: str, text: str) -> str:
    c = cipher()
    if c is None:
        return text
    return SEALED_BLOCK + seal_text(c, subject_of(tenant, agent), block_aad(tenant, agent, label), text)


def open_block(tenant: str, agent: str, label: str, stored: str) -> str:
    """Raises `KeyMissing` or `KeyDestroyed`. A text stored before sealing reads as it is."""
    if not stored.startswith(SEALED_BLOCK):
        return stored
    c = cipher()
    if c is None:
        raise ContractError("sealed", "a sealed block, and this process has no keys (events.codec.use_cipher)")
    return open_text(c, block_aad(tenant, agent, label), stored[len(SEALED_BLOCK):])


def _lean_record(raw: str) -> LeanRecord | None:
    try:
        return decode_lean(raw.encode()).record
    except ContractError:
        return None


def _segments(events: list[LeanEvent]) -> list[tuple[list[LeanEvent], LeanEvent | None]]:
    """The batch cut at each purge: (the events before it, the purge); the last has None."""
    out: list[tuple[list[LeanEvent], LeanEvent | None]] = []
    seg: list[LeanEvent] = []
    for e in events:
        if e.type in PURGE_EVENTS:
            out.append((seg, e))
            seg = []
        else:
            seg.append(e)
    out.append((seg, None))
    return out


def _row(e: Any) -> tuple[str, str, int, str, float, int, int, str, str] | None:
    """A record event as the view stores it (APPLY's 9 arguments per event): agent key,
    record id, version, the event's raw JSON, sort score, flags (1 listed + 2 pinned),
    expiry ms of a live record or -1, the live record it shadows (a preview record's
    `replaces`) or "", and the member whose listing a USER record is in, or "" (a record of
    another scope may name a member too, but is not theirs)."""
    e = as_lean(e)
    r = e.record
    if r is None:
        return None
    expiry = int(r.expires_at.timestamp() * 1000) if r.expires_at and r.status in LIVE else -1
    flags = int(listed(r)) + 2 * int(r.pinned and r.status is Status.ACTIVE)
    shadows = r.replaces if r.preview and r.replaces else ""
    user = r.user if r.scope is Scope.USER and r.user else ""
    return f"{r.tenant}/{r.agent}", r.id, r.version, e.raw, sort_score(r), flags, expiry, shadows, user


def _config_item(ns: str, e: Any) -> tuple[str, str]:
    full = as_lean(e).full()
    return agent_key(ns, "config", f"{full.tenant}/{full.agent}"), full.config.model_dump_json()


def _block_change(pipe: Any, ns: str, full: Any) -> tuple[str, str]:
    """A block's text (from the opened event `full`) replaces the last, sealed; an empty one
    removes the block. Events of one agent come in log order, so the last applied is the
    newest, as for configurations. Returns the block's (agent key, label)."""
    key = agent_key(ns, "blocks", f"{full.tenant}/{full.agent}")
    at = block_field(full.label, full.application)  # an application's block: `<application>:<label>`
    if full.text:
        pipe.hset(key, at, seal_block(full.tenant, full.agent, at, full.text))
    else:
        pipe.hdel(key, at)
    return f"{full.tenant}/{full.agent}", at


SUBJECT_EVENTS = ("ConsentGranted", "ConsentWithdrawn", "AgentRemoved", "UserRemoved", "UserRestored",
                  "TenantRestored")
REMOVED_TENANTS = "removed_tenants"  # `<ns>:removed_tenants`: tenants removed and not restored


def _subject_change(pipe: Any, ns: str, e: Any) -> None:
    """Consent is the newest grant or withdrawal of the member on the agent; a removal holds
    until an operator restores the member or the tenant. Events of one agent come in log
    order, as for configurations (a member's removal and restoration are both the workspace's)."""
    full = as_lean(e).full()
    if full.type == "AgentRemoved":
        pipe.sadd(f"{ns}:removed_agents:{full.tenant}", full.agent)
    elif full.type == "UserRemoved":
        pipe.sadd(f"{ns}:removed_users:{full.tenant}", full.user)
    elif full.type == "UserRestored":
        pipe.srem(f"{ns}:removed_users:{full.tenant}", full.user)
    elif full.type == "TenantRestored":
        pipe.srem(f"{ns}:{REMOVED_TENANTS}", full.tenant)
    else:
        state = "granted" if full.type == "ConsentGranted" else "withdrawn"
        pipe.hset(agent_key(ns, "consent", f"{full.tenant}/{full.agent}"), full.user, state)


def snapshot(raw: str) -> MemoryRecord:
    """The record a stored version holds: the raw event that made it, opened. Raises
    `KeyMissing` or `KeyDestroyed` (events.sealing) for a record it cannot open."""
    return _STORED.validate_json(opened(raw)).record


class _Stored(BaseModel):
    model_config = ConfigDict(extra="ignore")
    record: MemoryRecord


_STORED = TypeAdapter(_Stored)


def agent_key(ns: str, kind: str, ak: str) -> str:
    """An agent's key of `kind` in generation namespace `ns`, tagged with the agent."""
    return f"{ns}:{kind}:{agent_tag(ak)}"


def user_list_prefix(ns: str, ak: str) -> str:
    """What the agent's member listings start with: APPLY appends the member."""
    return f"{agent_key(ns, 'ulist', ak)}|"


def user_list_key(ns: str, ak: str, user: str) -> str:
    """The member's listing of their USER records on the agent."""
    return user_list_prefix(ns, ak) + user


APPLY_KINDS = ("rec", "list", "pinned", "shadowed", "users", "expiry")  # APPLY's KEYS, in order
AGENT_KINDS = (*APPLY_KINDS, "blocks", "consent", "usage",  # what dropping an agent unlinks, with its member listings
               redis_profiles.PROFILE_KIND)


def apply_keys(ns: str, ak: str) -> list[str]:
    return [agent_key(ns, kind, ak) for kind in APPLY_KINDS]


class RedisRecords:
    def __init__(
        self, client: aioredis.Redis, generation: int | None = None, namespace: str = "", announce: bool = False,
        keys: Keys | None = None,
    ) -> None:
        self.r = client
        # Catches up on a key not known yet, and publishes the keys a write seals under
        # first. Without it a key not known yet is the caller's to catch up on (KeyMissing).
        self.keys = keys
        self.unreadable = 0  # versions and blocks skipped: sealed under destroyed keys
        self.fixed_generation = generation
        # Deployments sharing one Redis (tests, demos) keep apart by namespace.
        self.root = f"ml:{namespace}"
        # `apply` publishes what it applied here: the live worker's writes, which API
        # requests wait for (`AppliedListener`). Rebuilds and replays have no one waiting.
        self.applied_channel = f"{self.root}applied"
        self.announce = announce
        self._listener: AppliedListener | None = None
        self._apply = client.register_script(APPLY)
        self._checkpoint = client.register_script(CHECKPOINT)
        self._usage = client.register_script(USAGE)
        self._used: dict[tuple[str, str], int] = {}  # (usage hash, record id) -> total, for `fill`
        self._drop_page = client.register_script(DROP_PAGE)
        self._registered: set[int] = set()
        self._read_gen: tuple[int, float] | None = None
        self._filled: dict[tuple[str, str], int] = {}  # (agent hash, record id) -> version, for `fill`

    # ------------------------------------------------------------------ opening

    async def _opening(self, fn: Any, *args: Any) -> Any:
        """`fn(*args)`, or None (counted) for what was sealed under a destroyed key."""
        out = await opening(self.keys, fn, *args)
        if out is None:
            self.unreadable += 1
        return out

    async def _snapshots(self, raws: list[str | None]) -> list[MemoryRecord]:
        out = []
        for raw in raws:
            if raw and (r := await self._opening(snapshot, raw)) is not None:
                out.append(r)
        return out

    async def _destroyed_kids(self, events: list[LeanEvent]) -> set[str]:
        """The data keys the batch's records are sealed under that are gone: not known here
        even after catching up (a key is published before anything sealed under it)."""
        knows = getattr(cipher(), "knows", None)
        if knows is None or self.keys is None:
            return set()
        unknown = {kid_of(e.record.sealed) for e in events if e.record is not None and e.record.sealed}
        unknown = {k for k in unknown if not knows(k)}
        if unknown:
            await self.keys.catch_up()
            unknown = {k for k in unknown if not knows(k)}
        return unknown

    def _readable(self, e: LeanEvent, gone: set[str]) -> bool:
        r = e.record
        if r is None or r.sealed is None or not gone or kid_of(r.sealed) not in gone:
            return True
        self.unreadable += 1
        return False

    def applied(self) -> AppliedListener:
        """This process's one subscription to what the view's worker applies."""
        if self._listener is None:
            self._listener = AppliedListener(self.r, self.applied_channel)
        return self._listener

    async def generation(self) -> int:
        if self.fixed_generation is not None:
            return self.fixed_generation
        g = await self.r.get(f"{self.root}generation")
        return int(g) if g else 1

    async def _read_generation(self) -> int:
        """The generation reads use, looked up at most once a second: a read saves a round
        trip, and after a switch the previous generation is kept, so reading it for a
        moment longer is safe. Writes always look it up (`generation`)."""
        now = time.monotonic()
        if self._read_gen is None or now - self._read_gen[1] > READ_GENERATION_TTL_S:
            self._read_gen = (await self.generation(), now)
        return self._read_gen[0]

    async def switch_generation(self, gen: int) -> None:
        await self.r.set(f"{self.root}generation", gen)

    async def generations(self) -> list[int]:
        """Generations that hold events, ascending. A registry, not a SCAN: scanning walks
        every key in the database, other deployments' too."""
        return sorted(int(g) for g in await self.r.smembers(f"{self.root}generations"))

    async def drop_generation(self, gen: int) -> int:
        """Delete a generation's keys a scan page at a time, so Redis keeps serving
        meanwhile; on one server the keys never travel to this process. A cluster's
        keys span slots and nodes, which one script cannot, so there each primary's
        SCAN pages come here and go back as an UNLINK per slot."""
        await self.r.srem(f"{self.root}generations", gen)
        if is_cluster(self.r):
            dropped, doomed = 0, []
            async for k in scan_keys(self.r, f"{self._ns(gen)}:*", count=10_000):
                doomed.append(k)
                if len(doomed) >= 10_000:
                    dropped += await unlink_keys(self.r, doomed)
                    doomed = []
            return dropped + await unlink_keys(self.r, doomed)
        dropped, cursor = 0, "0"
        while True:
            cursor, n = await self._drop_page(args=[cursor, f"{self._ns(gen)}:*"])
            dropped += n
            if cursor == "0":
                return dropped

    def _ns(self, gen: int) -> str:
        return f"{self.root}g{gen}"

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

    # ------------------------------------------------------------------ write side

    async def _register(self) -> str:
        gen = await self.generation()
        if gen not in self._registered:
            await self.r.sadd(f"{self.root}generations", gen)
            self._registered.add(gen)
        return self._ns(gen)

    async def apply(self, events: list[Any], positions: list[tuple[str, int]] | None = None) -> None:
        """Apply events; `positions[i]` is the (topic:partition, next offset) checkpoint of event i.

        The view and its checkpoints change in one script call: either both or neither. A
        batch with purges is applied up to each, then the purge, and the checkpoint moves
        with its last part: a crash in between applies it all again, which changes nothing.
        """
        await self._segmented(events, positions, self._apply_segment)

    async def _apply_segment(self, ns: str, events: list[LeanEvent], gone: set[str],
                             positions: list[tuple[str, int]] | None) -> None:
        if not events and positions is None:
            return
        rows: dict[str, list[Any]] = {}  # agent key -> APPLY's 8 arguments per event
        pre = self.r.pipeline(transaction=False)  # configurations, blocks, consent; one key each
        changed: dict[str, list[tuple[str, str | None, str]]] = {}  # agent key -> announced changes
        expiring: set[str] = set()
        used: dict[str, dict[str, int]] = {}  # agent key -> record id -> usage total
        for e in events:
            row = _row(e) if self._readable(e, gone) else None
            if row is not None:
                rows.setdefault(row[0], []).extend(row[1:])
                if row[6] != -1:
                    expiring.add(row[0])
            elif e.type == "AgentConfigured":
                pre.set(*_config_item(ns, e))
                if self.announce:  # a configuration's writer reads it back at once (read-your-writes)
                    ak = f"{e.tenant}/{e.agent}"
                    changed.setdefault(ak, []).append((ak, None, e.command_id))
            elif e.type == "BlockChanged":
                if (full := await self._opening(e.full)) is not None:
                    ak, label = _block_change(pre, ns, full)
                    changed.setdefault(ak, []).append((ak, label, e.command_id))
            elif e.type in SUBJECT_EVENTS:
                # Before the batch's records and its checkpoint: a withdrawal is never behind them.
                _subject_change(pre, ns, e)
                if self.announce:  # a wait for a consent or a removal hears of this command's
                    ak = f"{e.tenant}/{e.agent}"
                    changed.setdefault(ak, []).append((ak, None, e.command_id))
            elif e.type in redis_runs.RUN_EVENTS:
                redis_runs.fold(pre, ns, e.raw)  # session memory: before the checkpoint, as blocks
            elif e.type in redis_notes.NOTE_EVENTS:
                redis_notes.fold(pre, ns, e.raw)  # notes (docs/features/notes.md), likewise
            elif e.type in redis_profiles.PROFILE_EVENTS:
                redis_profiles.fold(pre, ns, e.raw)  # member profiles: before the checkpoint, as blocks
            elif e.type in redis_shared.SHARED_EVENTS:
                redis_shared.fold(pre, ns, e.raw)  # tenant and platform memory, likewise
            elif e.type == "UsageRecorded":
                _usage_totals(used, e)
        if expiring:
            # The sweep's registry of agents with expiring records: written first, so a record
            # with an expiry is never in an agent the sweep does not know of.
            pre.sadd(f"{ns}:expiring", *sorted(expiring))
        if len(pre):
            await self._flush_keys()
            await pre.execute()
        channel = self.applied_channel if self.announce else ""
        agents = list(rows) + [ak for ak in changed if ak not in rows]
        ckpt = _checkpoints(positions)

        def scripts(p: Any) -> None:
            for ak in agents:
                # execute_command: redis-py's cluster pipeline refuses its evalsha() method.
                p.execute_command("EVALSHA", self._apply.sha, len(APPLY_KINDS), *apply_keys(ns, ak),
                          user_list_prefix(ns, ak), channel, json.dumps(changed.get(ak, [])), ak,
                          *rows.get(ak, ()))
            for ak, totals in used.items():
                p.execute_command("EVALSHA", self._usage.sha, 1, agent_key(ns, "usage", ak),
                                  *[x for kv in sorted(totals.items()) for x in kv])

        def checkpoint(p: Any) -> None:
            if ckpt:
                p.execute_command("EVALSHA", self._checkpoint.sha, 1, f"{ns}:ckpt", json.dumps(ckpt))

        await write_then(self.r, scripts, checkpoint, scripts=(self._apply, self._checkpoint, self._usage))

    async def _flush_keys(self) -> None:
        """The keys this process made go out before anything sealed under them is written."""
        if self.keys is not None:
            await self.keys.flush()

    async def fill(self, events: list[Any], positions: list[tuple[str, int]] | None = None) -> None:
        """`apply` for a generation that this process alone fills, in log order, for the
        agents it folds (a rebuild's shard). It knows every record's current version
        itself, so it sends plain commands, one HSET per agent for the batch's versions:
        no script, whose interpreter cost redis-server more than the writes. The sorted
        sets follow, then the checkpoint, so it never gets ahead of the view; a rebuild
        that fails starts a new generation anyway."""
        await self._segmented(events, positions, self._fill_segment)

    async def _segmented(self, events: list[Any], positions: list[tuple[str, int]] | None, step: Any) -> None:
        """`step` over the batch up to each purge, then the purge; the checkpoint goes with the last part."""
        ns = await self._register()
        lean = [as_lean(e) for e in events]
        gone = await self._destroyed_kids(lean)
        for seg, purge in _segments(lean):
            await step(ns, seg, gone, None if purge else positions)
            if purge is not None:
                await self.purge(ns, purge)

    async def _fill_segment(self, ns: str, events: list[LeanEvent], gone: set[str],
                            positions: list[tuple[str, int]] | None) -> None:
        pipe = self.r.pipeline(transaction=False)
        changes: dict[str, dict[str, float | None]] = {}
        users: dict[str, set[str]] = {}  # the agent's set of members -> members this batch names
        versions: dict[str, list[Any]] = {}  # agent hash -> field, value, ...
        expiring: set[str] = set()
        for e in events:
            row = _row(e) if self._readable(e, gone) else None
            if row is None:
                if e.type == "AgentConfigured":
                    pipe.set(*_config_item(ns, e))
                elif e.type == "BlockChanged":
                    if (full := await self._opening(e.full)) is not None:
                        _block_change(pipe, ns, full)
                elif e.type in SUBJECT_EVENTS:
                    _subject_change(pipe, ns, e)
                elif e.type in redis_runs.RUN_EVENTS:
                    redis_runs.fold(pipe, ns, e.raw)
                elif e.type in redis_notes.NOTE_EVENTS:
                    redis_notes.fold(pipe, ns, e.raw)
                elif e.type in redis_profiles.PROFILE_EVENTS:
                    redis_profiles.fold(pipe, ns, e.raw)
                elif e.type in redis_shared.SHARED_EVENTS:
                    redis_shared.fold(pipe, ns, e.raw)
                elif e.type == "UsageRecorded":
                    self._fill_usage(pipe, ns, e)
                continue
            ak, rid, ver, raw, score, flags, expiry, shadows, user = row
            rk = agent_key(ns, "rec", ak)
            if shadows:
                pipe.sadd(agent_key(ns, "shadowed", ak), shadows)
            if user:
                users.setdefault(agent_key(ns, "users", ak), set()).add(user)
            if expiry != -1:
                expiring.add(ak)
            cur = self._filled.get((rk, rid), 0)
            if ver <= cur:
                pipe.hsetnx(rk, f"{rid}#{ver}", raw)
                continue
            self._filled[rk, rid] = ver
            versions.setdefault(rk, []).extend((f"{rid}#{ver}", raw, rid, ver))
            later = cur > 0  # a first version has no earlier listing, pin or expiry to take back
            zsets = [
                (agent_key(ns, "list", ak), rid, flags & 1, score),
                (agent_key(ns, "pinned", ak), rid, flags & 2, score),
                (agent_key(ns, "expiry", ak), rid, expiry != -1, expiry),
            ]
            if user:
                zsets.append((user_list_key(ns, ak, user), rid, flags & 1, score))
            for key, member, on, value in zsets:
                if on or later:
                    changes.setdefault(key, {})[member] = value if on else None
        if expiring:
            pipe.sadd(f"{ns}:expiring", *sorted(expiring))
        for rk, fields in versions.items():
            pipe.execute_command("HSET", rk, *fields)
        for key, members in changes.items():
            if add := {m: v for m, v in members.items() if v is not None}:
                pipe.zadd(key, add)
            if rem := [m for m, v in members.items() if v is None]:
                pipe.zrem(key, *rem)
        for key, names in users.items():
            pipe.sadd(key, *names)
        if len(pipe):
            await self._flush_keys()
            await pipe.execute()
        # After the view's writes, which on a cluster go to several nodes at once.
        if ckpt := _checkpoints(positions):
            await self.r.hset(f"{ns}:ckpt", mapping=ckpt)

    def _fill_usage(self, pipe: Any, ns: str, e: Any) -> None:
        """`USAGE` for `fill`, which knows the totals it wrote: plain HSETs of those that grew."""
        key = agent_key(ns, "usage", f"{e.tenant}/{e.agent}")
        grew = {rid: n for rid, n in e.totals.items() if n > self._used.get((key, rid), 0)}
        if grew:
            self._used.update({(key, rid): n for rid, n in grew.items()})
            pipe.hset(key, mapping=grew)

    # ------------------------------------------------------------------ purges

    async def purge(self, ns: str, e: Any) -> None:
        """Drops what a `SubjectErased` or a `RecordsPurged` names from generation namespace
        `ns`. Idempotent."""
        e = as_lean(e)
        if e.type == "RecordsPurged":
            await self._drop_records(ns, f"{e.tenant}/{e.agent}", set(e.record_ids))
            return
        er = Erasure.of(e)
        await redis_notes.purge(self.r, ns, er)  # notes go with their member, or with their agent
        if er.agent is None and er.user is None:  # the whole tenant: its conventions and floors too
            await redis_shared.purge_tenant(self.r, ns, er.tenant)
            await self.r.sadd(f"{ns}:{REMOVED_TENANTS}", er.tenant)  # removed until restored
        agents = [er.agent] if er.agent is not None else await self._agents_of(ns, er.tenant)
        for agent in agents:
            ak = f"{er.tenant}/{agent}"
            await redis_runs.purge(self, ns, er.tenant, agent, er.user)
            if er.user is None:
                await self._drop_agent(ns, ak)
            else:
                await self._drop_member(ns, ak, er.user)

    async def _scan(self, match: str) -> list[str]:
        """Every key matching `match`: every primary's, on a cluster."""
        return [k async for k in scan_keys(self.r, match, count=PAGE)]

    async def _tagged_agents(self, ns: str, kind: str, tenant: str) -> set[str]:
        """The agents of `tenant` that have a key of `kind` (`<ns>:<kind>:{<tenant>/<agent>}`)."""
        prefix = f"{ns}:{kind}:{{{tenant}/"
        return {k[len(prefix):-1] for k in await self._scan(f"{prefix}*}}")}

    async def _agents_of(self, ns: str, tenant: str) -> set[str]:
        """The agents of `tenant` the view holds anything of."""
        agents = set()
        for kind in ("rec", "blocks", "consent", redis_profiles.PROFILE_KIND):
            agents |= await self._tagged_agents(ns, kind, tenant)
        return agents

    async def _drop_agent(self, ns: str, ak: str) -> None:
        """Everything of an agent but its configuration (no personal data; the log holds it in
        the clear): its keys, one slot, and its member listings, named by its set of members."""
        members = await self.r.smembers(agent_key(ns, "users", ak))
        keys = [agent_key(ns, kind, ak) for kind in AGENT_KINDS] + [user_list_key(ns, ak, u) for u in sorted(members)]
        await unlink_keys(self.r, keys, PAGE)
        await self.r.srem(f"{ns}:expiring", ak)
        rk, uk = agent_key(ns, "rec", ak), agent_key(ns, "usage", ak)
        self._filled = {k: v for k, v in self._filled.items() if k[0] != rk}
        self._used = {k: v for k, v in self._used.items() if k[0] != uk}

    async def _drop_member(self, ns: str, ak: str, user: str) -> None:
        """Every version of the records that name the member on the agent (their USER records
        and what else was made from their turns), their listing, their
        consent and their place among the agent's members. Walks the agent's versions (a
        deleted or superseded record is in no listing): an erasure is rare."""
        rk = agent_key(ns, "rec", ak)
        rids: set[str] = set()
        fields: list[str] = []
        needle = f'"user":"{user}"'
        async for field, raw in self.r.hscan_iter(rk, match="*#*", count=PAGE):
            if needle not in raw:
                continue
            r = _lean_record(raw)
            if r is not None and r.user == user:  # theirs in any scope: made from their turn
                rids.add(field.partition("#")[0])
                fields.append(field)
        await self._drop_records(ns, ak, rids, fields, {user})
        pipe = self.r.pipeline(transaction=False)
        pipe.execute_command("UNLINK", user_list_key(ns, ak, user))  # cluster pipelines make unlink() a coroutine
        pipe.srem(agent_key(ns, "users", ak), user)
        pipe.hdel(agent_key(ns, "consent", ak), user)
        pipe.hdel(agent_key(ns, redis_profiles.PROFILE_KIND, ak), user)  # the member's profile
        await pipe.execute()

    async def _drop_records(self, ns: str, ak: str, rids: set[str], fields: list[str] | None = None,
                            users: set[str] | None = None) -> None:
        """Every version of `rids` (`fields`, their versions, when the caller found them) and
        their places in the agent's listings."""
        if not rids:
            return
        rk, ids = agent_key(ns, "rec", ak), sorted(rids)
        if fields is None:
            currents = await self.r.hmget(rk, ids)
            fields = [f"{rid}#{v}" for rid, cur in zip(ids, currents) if cur for v in range(1, int(cur) + 1)]
            users = set(users or ())
            latest = [f"{rid}#{cur}" for rid, cur in zip(ids, currents) if cur]
            for raw in await self.r.hmget(rk, latest) if latest else []:
                r = _lean_record(raw) if raw else None
                if r is not None and r.scope is Scope.USER and r.user:
                    users.add(r.user)
        pipe = self.r.pipeline(transaction=False)
        doomed = ids + fields
        for i in range(0, len(doomed), PAGE):
            pipe.hdel(rk, *doomed[i:i + PAGE])
        for i in range(0, len(ids), PAGE):
            chunk = ids[i:i + PAGE]
            for kind in ("list", "pinned", "expiry"):
                pipe.zrem(agent_key(ns, kind, ak), *chunk)
            pipe.srem(agent_key(ns, "shadowed", ak), *chunk)
            pipe.hdel(agent_key(ns, "usage", ak), *chunk)
            for user in users or ():
                pipe.zrem(user_list_key(ns, ak, user), *chunk)
        await pipe.execute()
        for rid in ids:
            self._filled.pop((rk, rid), None)
            self._used.pop((agent_key(ns, "usage", ak), rid), None)

    async def checkpoints(self, gen: int | None = None) -> dict[str, int]:
        gen = gen if gen is not None else await self.generation()
        raw = await self.r.hgetall(f"{self._ns(gen)}:ckpt")
        return {k: int(v) for k, v in raw.items()}

    # ------------------------------------------------------------------ read side

    async def get(self, tenant, agent, rid, version=None) -> MemoryRecord | None:
        if version is None:
            found = await self.get_many(tenant, agent, [rid])
            return found[0] if found else None
        key = self._keys(await self._read_generation(), tenant, agent)[0]
        raw = await self.r.hget(key, f"{rid}#{version}")
        return await self._opening(snapshot, raw) if raw else None

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

    async def agents(self, tenant: str) -> list[str]:
        """The tenant's configured agents: a SCAN of the view, for an operator's page, not a hot path."""
        return sorted(await self._tagged_agents(self._ns(await self._read_generation()), "config", tenant))

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
            if (r := _lean_record(raw)) is not None:
                k = (r.status.value, r.kind, r.scope.value)
                counts[k] = counts.get(k, 0) + 1
        return counts

    async def users(self, tenant: str, agent: str) -> set[str]:
        """The members who have (or had) USER records on the agent."""
        return await self.r.smembers(self._agent(await self._read_generation(), "users", tenant, agent))

    async def pinned(self, tenant, agent) -> list[MemoryRecord]:
        key = self._keys(await self._read_generation(), tenant, agent)[2]
        rids = await self.r.zrange(key, 0, -1)
        return [r for r in await self.get_many(tenant, agent, rids) if r.pinned and r.status is Status.ACTIVE]

    async def blocks(self, tenant, agent) -> dict[str, str]:
        """The agent's memory blocks, label -> text (opened; one sealed under a destroyed key is left out).
        An application's blocks are here too, under `<application>:<label>` (`events.commands.block_field`)."""
        stored = await self.r.hgetall(self._agent(await self._read_generation(), "blocks", tenant, agent))
        out = {}
        for label, value in stored.items():
            if (text := await self._opening(open_block, tenant, agent, label, value)) is not None:
                out[label] = text
        return out

    async def shadowed(self, tenant, agent) -> set[str]:
        """Live records a preview record replaces or deletes: preview turns skip them."""
        return await self.r.smembers(self._agent(await self._read_generation(), "shadowed", tenant, agent))

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

    async def aclose(self) -> None:
        if self._listener is not None:
            await self._listener.aclose()
        await self.r.aclose()
