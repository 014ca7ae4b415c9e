"""Compares the record view with the memory index, agent by agent, and heals what differs.

The projection's checkpoint already keeps every record it has read; this is the second
line of defence, for whatever else could lose a point. An ACTIVE record of the view that
is not a point gets one (its vector from the projection's cache, else embedded here:
the same model gives the same vector), and a point whose record the view holds in a
state that is not indexable goes. A point the view knows nothing of stays: a view being
rebuilt knows nothing yet.

Both views follow the log on their own, so a difference can be mere lag. An agent is
compared only once its shard's projection has written every event the view reflects,
and the projection applies a heal in order with its own writes, skipping any record it
has since seen newer (`QdrantProjection.heal`). A record parked for its vector heals
only if it is still parked, at the same version, on the next visit.

Runs in the serving process once its shards are caught up, then every
`reconcile_every_s`, each run bounded; `run_once` runs one on demand.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from events.codec import Codec, ContractError
from events.lean import LeanRecord, decode_lean
from events.sealing import KeyDestroyed, KeyMissing
from events.topics import EVENTS
from projections.embedders.port import Embedder
from projections.qdrant.index import indexable
from projections.redis.connection import Connect
from projections.redis.record_view import RedisRecords
from settings import Settings
from workers.runtime.topic_reader import checkpoint_key

if TYPE_CHECKING:
    from workers.followers.qdrant_projection import QdrantProjection


class Shards(Protocol):
    """What the reconciler reads of the shards it heals: the projection of an agent, the
    process's data keys and embedder, and when the projections have caught up."""

    codec: Codec
    keys: Any
    embedder: Embedder | None

    def of(self, tenant: str, agent: str) -> QdrantProjection: ...

    async def caught_up(self) -> None: ...

log = structlog.get_logger()
RECORDS_PER_RUN = 20_000  # records compared per run, at most about
HEALS_PER_RUN = 500  # points written per run, at most about: embedding is the costly part
SCAN_PAGE = 500
LAG_WAIT_S = 5.0  # how long an agent waits for its projection to reach the view's position
READ_PAGE = 1000  # records read from the view per Redis call
READ_PACE = 20_000  # records per second at most: the reconciler runs beside live traffic


@dataclass
class Gaps:
    missing: list[LeanRecord] = field(default_factory=list)  # indexable in the view, not a point
    stale: list[tuple[str, int]] = field(default_factory=list)  # points the view holds unindexable: (id, version)


def gaps(view: Mapping[str, LeanRecord], points: set[str]) -> Gaps:
    """One agent's differences. `view`: the current version of each record the view lists
    or the index holds; `points`: the record ids of the agent's points."""
    out = Gaps()
    r: LeanRecord | None  # a record of the view; in the second loop, None for a point it lacks
    for rid, r in view.items():
        if indexable(r) and rid not in points:
            out.missing.append(r)
    for rid in points:
        r = view.get(rid)
        if r is not None and not indexable(r):
            out.stale.append((rid, r.version))
    return out


def settled(landed: int, view_at: int, started: int) -> bool:
    """Whether a partition's record view and index can be compared: the projection has
    written every event the view reflects (`landed` >= `view_at`), and the view has
    every event that was in the index before the projection last started, whose
    versions the projection does not know (`view_at` >= `started`)."""
    return landed >= view_at >= started


class Reconciler:
    def __init__(self, settings: Settings, shards: Shards, redis: Connect, store: RedisRecords | None = None) -> None:
        self.settings = settings
        self.shards = shards
        self.redis = redis
        self.store = store
        self._own_store = store is None
        self.generation: int | None = None  # of the view the scan cursor walks
        self.cursor = 0
        self.pending: list[tuple[str, str]] = []  # (tenant, agent) of a scan page not visited yet
        # (tenant, agent) -> {record id: version} parked for a vector at the last visit
        self.parked_seen: dict[tuple[str, str], dict[str, int]] = {}
        self.healed = self.added = self.removed = self.deferred = self.runs = self.unreadable = 0
        self.last_run: float | None = None

    def status(self) -> dict[str, Any]:
        last = datetime.fromtimestamp(self.last_run, UTC).isoformat() if self.last_run else None
        return {"healed": self.healed, "added": self.added, "removed": self.removed, "deferred": self.deferred,
                "runs": self.runs, "last_run": last}

    async def run(self, every_s: float, delay_s: float = 0.0) -> None:
        """After the shards are caught up and `delay_s` more, a run, then one every `every_s` s
        (0: only that one)."""
        await self.shards.caught_up()
        await asyncio.sleep(delay_s)
        while True:
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("reconciler_failed")  # the next run tries again
            if every_s <= 0:
                return
            await asyncio.sleep(every_s)

    async def run_once(self, records: int = RECORDS_PER_RUN, heals: int = HEALS_PER_RUN) -> int:
        """Visit agents from where the last run stopped until about `records` records were
        compared, `heals` healed, or every agent visited. Returns the count healed."""
        store = self._store()
        gen = await store.generation()
        if gen != self.generation:
            self.generation, self.cursor, self.pending = gen, 0, []
        compared = healed = 0
        started_cycle = self.cursor == 0 and not self.pending
        while compared < records and healed < heals:
            if not self.pending:
                if self.cursor == 0 and not started_cycle:
                    break  # every agent visited
                started_cycle = False
                self.cursor, self.pending = await store.scan_agents(gen, self.cursor, SCAN_PAGE)
                continue
            tenant, agent = self.pending.pop()
            n, fixed = await self._agent(store, gen, tenant, agent)
            compared += n
            healed += fixed
        self.runs += 1
        self.last_run = time.time()
        if healed:
            log.warning("reconciler_healed", points=healed, healed_total=self.healed)
        return healed

    def _store(self) -> RedisRecords:
        if self.store is None:
            self.store = RedisRecords(self.redis(pooled=True), namespace=self.settings.topic_prefix,
                                      codec=self.shards.codec)
        return self.store

    async def _agent(self, store: RedisRecords, gen: int, tenant: str, agent: str) -> tuple[int, int]:
        """(records compared, points healed) for one agent."""
        proj = self.shards.of(tenant, agent)
        part = checkpoint_key(self.settings.topic(EVENTS.name), EVENTS.partition_of(f"{tenant}/{agent}".encode()))
        # The checkpoint is read first: a view read after it is at least as new, never older
        # than the position the projection is then waited for.
        view_at, listed = await store.listing(gen, tenant, agent, part)
        candidates = set(listed) | await asyncio.to_thread(proj.index.record_ids, tenant, agent)
        view = await _current(store, gen, tenant, agent, sorted(candidates))
        if not await _landed(proj, part, view_at):
            self.deferred += 1
            return 0, 0
        # Read again now that the projection has written all the view reflects.
        found = gaps(view, await asyncio.to_thread(proj.index.record_ids, tenant, agent))
        missing = self._missing(proj, tenant, agent, found.missing)
        stale = [((tenant, agent, rid), v) for rid, v in found.stale
                 if proj.versions.get((tenant, agent, rid), 0) <= v]
        if not missing and not stale:
            return len(view), 0
        upserts = await self._vectors(proj, missing)
        shadowed = set()
        if upserts:
            ids = await store.shadowed_in(gen, tenant, agent)
            shadowed = {(tenant, agent, rid) for rid in ids}
        try:
            added, removed = await asyncio.wait_for(proj.heal(upserts, stale, shadowed), timeout=30)
        except TimeoutError:
            log.warning("reconciler_heal_timed_out", points=len(upserts) + len(stale))
            return len(view), 0
        self.added += added
        self.removed += removed
        self.healed += added + removed
        return len(view), added + removed

    def _missing(self, proj: QdrantProjection, tenant: str, agent: str, missing: list[LeanRecord]) -> list[LeanRecord]:
        """The missing records to heal now: not newer in the projection than in the view, and
        not parked for a vector unless they already were, at this version, last visit."""
        before = self.parked_seen.pop((tenant, agent), {})
        now: dict[str, int] = {}
        out = []
        for r in missing:
            rk = (tenant, agent, r.id)
            if proj.versions.get(rk, 0) > r.version:
                continue
            parked = proj.parked_version(rk)
            if parked is not None and before.get(r.id) != parked:
                now[r.id] = parked
                continue
            out.append(r)
        if now:
            self.parked_seen[tenant, agent] = now
        return out

    async def _opened(self, r: LeanRecord) -> tuple[LeanRecord, str] | None:
        """The record opened and its vector's content hash; None for one sealed under a
        destroyed key (an erased subject's: no point to heal)."""
        for attempt in (1, 2):
            try:
                opened, h, _ = r.vector_of(self.shards.codec.cipher)
                return opened, h
            except KeyMissing:
                keys = self.shards.keys
                if attempt == 2 or keys is None:
                    break
                await keys.catch_up()
            except (KeyDestroyed, ContractError):
                break
        self.unreadable += 1
        return None

    async def _vectors(self, proj: QdrantProjection, records: list[LeanRecord]) -> list[tuple[LeanRecord, Any]]:
        """Opened records and their vectors: from the projection's cache, else embedded."""
        out: list[tuple[LeanRecord, Any]]
        todo: list[tuple[LeanRecord, Any]]
        out, todo = [], []
        for r in records:
            got = await self._opened(r)
            if got is None:
                continue
            vec = proj.cached_vector(got[1])
            (todo if vec is None else out).append((got[0], vec))
        embedder = self.shards.embedder
        if todo and embedder is None:
            # A process given no embedder heals only the points whose vectors are cached.
            self.deferred += len(todo)
        elif embedder is not None and todo:
            vecs = await asyncio.to_thread(embedder.embed, [r.text for r, _ in todo])
            out += [(r, v) for (r, _), v in zip(todo, vecs, strict=True)]
        return out

    async def aclose(self) -> None:
        if self._own_store and self.store is not None:
            await self.store.aclose()
            self.store = None


async def _current(store: RedisRecords, gen: int, tenant: str, agent: str, ids: list[str]) -> dict[str, LeanRecord]:
    """The current version of each of `ids` the view holds, as the projection reads records.

    A page at a time, decoded in a thread, with a pause after each: an agent can hold
    100,000 records, and reading them in one Redis call or decoding them in one go stalled
    the searches and recalls the same process and Redis serve."""
    out: dict[str, LeanRecord] = {}
    for i in range(0, len(ids), READ_PAGE):
        raws = await store.current_raw(gen, tenant, agent, ids[i:i + READ_PAGE])
        if raws:
            out.update(await asyncio.to_thread(_decode_records, raws))
        await asyncio.sleep(READ_PAGE / READ_PACE)
    return out


def _decode_records(raws: list[str]) -> dict[str, LeanRecord]:
    out = {}
    for raw in raws:
        try:
            record = decode_lean(raw.encode()).record
        except ContractError:
            continue  # the view stores what the ledger wrote; a reader only skips
        if record is not None:
            out[record.id] = record
    return out


async def _landed(proj: QdrantProjection, part: str, view_at: int) -> bool:
    """Wait a little for the projection to write up to the view's position."""
    deadline = time.monotonic() + LAG_WAIT_S
    while not settled(proj.ckpt.get(part, 0), view_at, proj.started.get(part, 0)):
        if view_at < proj.started.get(part, 0) or time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True
