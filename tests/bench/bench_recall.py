"""recall: latency over HTTP with 100,000 records in one agent and 1,000,000 in all,
synthetic seeded vectors written through the normal projection path (events + vectors
topics -> Redis and Qdrant).

`_user_scope` figures recall as one member of a second agent of 100,000 user-scope records
spread over `USERS` members, 200 each (the live-fact cap), configured as the member-facts
preset is (consent required, user scope, the facts block, which renders every live fact that
fits), every member's consent granted (a `ConsentGranted` event in the log): the same
measurement, run right after the agent-scope one. Every answer is checked to hold only that
member's records, and more of them than a ranked search's page.

The loaded deployment (topics, Redis generation, Edge shards under .run/bench<DEPLOYMENT>) is
kept between runs: the first run loads the log (minutes), measures the live unoptimized
index, then builds the optimized generation as `memlane rebuild --target qdrant --optimize`
does (tens of minutes at 1M on 2 cores). Later runs measure straight away."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import numpy as np

from events import AgentConfig, ConsentGranted, Message, RecordAdded, TurnCommitted, encode
from events.commands import WORKSPACE, NoteSource
from events.config import SearchConfig
from events.memory import (
    AgentConfigured,
    ConventionApproved,
    ConventionProposed,
    NoteSaved,
    PlatformEntrySet,
    ProfileChanged,
    RunEntryAdded,
    RunSummarized,
    TenantFloorSet,
)
from events.record import MemoryRecord
from events.rules.ledger import LIVE_FACT_CAP
from events.topics import EVENTS, VECTORS
from events.vectors import VectorComputed
from projections.embedders.port import MODEL_ID, content_hash
from services.bootstrap import index_generations, keys_at
from services.client import MemlaneClient, TurnPublisher
from settings import Settings
from tests.bench.bench_rebuild import _produce, vector_partition_of
from tests.bench.common import bench_stack, figure, percentile, progress
from tests.redis_at import redis_at
from workers.jobs.rebuild import rebuild_all

AGENT_RECORDS = 100_000
TOTAL = int(os.environ.get("MEMLANE_BENCH_RECALL_TOTAL", "1000000"))
OTHER_AGENTS = 900
USERS = AGENT_RECORDS // LIVE_FACT_CAP  # the user-scope agent's members: 200 live facts each
MEMBER = "u0"  # the member who recalls
QUERIES = 200
# v2: vectors beside their agents' partitions; a log kept from before would never join.
# v3: a user-scope agent ("bigu", records AGENT_RECORDS..2*AGENT_RECORDS-1) beside "big".
# v4: 200 facts per member of "bigu", which renders the facts block.
DEPLOYMENT = f"recall{TOTAL}v4"
WARMUP = 50  # a freshly started server faults its shard pages in on the first queries
T0 = datetime(2026, 1, 1, tzinfo=UTC)
WORDS = "invoice shipping refund parcel customer account password billing order delivery address contract".split()


def _owner(i: int) -> tuple[str, str | None]:
    """The agent of record `i`, and its member when it is a user-scope record."""
    if i < AGENT_RECORDS:
        return "big", None
    if i < 2 * AGENT_RECORDS:
        return "bigu", f"u{i % USERS}"
    return f"other{i % OTHER_AGENTS}", None


def _items(settings):
    if TOTAL < 2 * AGENT_RECORDS:
        raise ValueError(f"MEMLANE_BENCH_RECALL_TOTAL must be at least {2 * AGENT_RECORDS}: two measured agents")
    for u in range(USERS):
        g = ConsentGranted(event_id=f"g{u}", command_id=f"g{u}", tenant="bench", agent="bigu", occurred_at=T0,
                           user=f"u{u}")
        yield settings.topic(EVENTS.name), EVENTS.key_bytes(g), encode(g)
    rng = np.random.default_rng(42)
    for i in range(TOTAL):
        agent, user = _owner(i)
        text = f"{WORDS[i % 12]} {WORDS[(i // 12) % 12]} note {i} for {agent}"
        vec = rng.standard_normal(384).astype(np.float32)
        vec /= np.linalg.norm(vec)
        v = VectorComputed.of(MODEL_ID, content_hash(text), vec)
        yield settings.topic(VECTORS.name), VECTORS.key_bytes(v), encode(v), vector_partition_of(agent)
        r = MemoryRecord(id=f"r{i}", version=1, created=T0 + timedelta(seconds=i), modified=T0, tenant="bench",
                         agent=agent, scope="USER" if user else "AGENT", user=user, kind="fact", summary=text)
        e = RecordAdded(event_id=f"e{i}", command_id=f"c{i}", tenant="bench", agent=agent, occurred_at=T0, record=r)
        yield settings.topic(EVENTS.name), EVENTS.key_bytes(e), encode(e)


# Every layer present: episodes and procedures among the measured agent's records,
# and a run with a summary and entries that recall names.
LAYER_RECORDS = 2_000  # of each kind, beside the agent's 100,000 facts
RUN = "bench-run"
# The shared layers, on "big" as member PROFILED: a profile, notes citing a history session,
# the tenant's floors and approved conventions, the platform's policies and defaults.
PROFILED = "u0"
NOTES_SESSION = "bench-notes"
SHARED_ENTRIES = 3  # of each of floors, conventions, policies, defaults
LAYER_NOTES = 10
NOTE_SOURCES = 4


def _layer_items(settings, now: datetime):
    rng = np.random.default_rng(7)
    for j in range(2 * LAYER_RECORDS):
        kind = "episode" if j % 2 == 0 else "procedure"
        text = f"{kind}: the {WORDS[j % 12]} {WORDS[(j // 12) % 12]} case {j} went well"
        vec = rng.standard_normal(384).astype(np.float32)
        vec /= np.linalg.norm(vec)
        v = VectorComputed.of(MODEL_ID, content_hash(text), vec)
        yield settings.topic(VECTORS.name), VECTORS.key_bytes(v), encode(v), vector_partition_of("big")
        meta = {"anti_pattern": j % 10 == 1} if kind == "procedure" else {}
        r = MemoryRecord(id=f"L{j}", version=1, created=T0, modified=T0, tenant="bench", agent="big", scope="AGENT",
                         kind=kind, summary=text, metadata=meta)
        e = RecordAdded(event_id=f"eL{j}", command_id=f"cL{j}", tenant="bench", agent="big", occurred_at=T0, record=r)
        yield settings.topic(EVENTS.name), EVENTS.key_bytes(e), encode(e)
    yield from _run_items(settings, now)


def _run_items(settings, now: datetime, user: str | None = None):
    """A run written just now (a run expires 48 hours after its last write): six entries, and
    a summary of the first four, as the run-compression worker leaves it. A run is one
    member's (`user`) or the agent's own."""
    tag = uuid.uuid4().hex[:8]
    ids = [f"run-{tag}-{i}" for i in range(6)]
    for i, eid in enumerate(ids):
        e = RunEntryAdded(event_id=f"e{eid}", command_id=f"c{eid}", tenant="bench", agent="big", occurred_at=now,
                          run=RUN, entry_id=eid, summary=f"Step {i} of the run: checked the {WORDS[i]} records",
                          content="The batch was compared row by row.", run_last_write=now, user=user)
        yield settings.topic(EVENTS.name), EVENTS.key_bytes(e), encode(e)
    summary = RunSummarized(event_id=f"s{tag}", command_id=f"s{tag}", tenant="bench", agent="big", occurred_at=now,
                            user=user, run=RUN, summary="Earlier in the run: " + "the refunds were reconciled; " * 12,
                            entry_ids=ids[:4], run_last_write=now)
    yield settings.topic(EVENTS.name), EVENTS.key_bytes(summary), encode(summary)


async def _with_layers(stack, settings) -> None:
    """Writes the layers once (the run again once it expired) and waits until they are served."""
    from projections.redis.record_view import RedisRecords
    from projections.redis.run_view import RunView

    store = RedisRecords(redis_at(settings.redis_url)(pooled=True), namespace=settings.topic_prefix)
    try:
        now = datetime.now(UTC)
        if await store.get("bench", "big", "L0") is None:
            await _produce(settings, _layer_items(settings, now))
        elif not (await RunView(store).session("bench", "big", RUN, now))[0]:
            await _produce(settings, _run_items(settings, now))
        async with httpx.AsyncClient(base_url=stack.api_url, timeout=30) as h:
            while True:
                points = (await h.get("/health")).json()["projection"]["points"]
                entries, summary = await RunView(store).session("bench", "big", RUN, datetime.now(UTC))
                last = await store.get("bench", "big", f"L{2 * LAYER_RECORDS - 1}")
                if points >= TOTAL + 2 * LAYER_RECORDS and last is not None and len(entries) >= 2 and summary:
                    return
                progress(f"layers: {points - TOTAL} of {2 * LAYER_RECORDS} points, run entries {len(entries)}")
                await asyncio.sleep(2)
    finally:
        await store.aclose()


def _every_layer_items(settings, now: datetime):
    """The shared layers' events, written as the ledger would have (a kept deployment runs no
    ledger): history turned on for "big" (and sessions, which history needs), a profile,
    notes, and the tenant's and the platform's entries."""
    def ev(cls, tenant: str, agent: str, n: str, **kw):
        e = cls(event_id=f"e-{n}", command_id=f"c-{n}", tenant=tenant, agent=agent, occurred_at=now, **kw)
        return settings.topic(EVENTS.name), EVENTS.key_bytes(e), encode(e)

    cfg = AgentConfig.model_validate({"memory": {"scope": {"read": ["agent"], "write": ["agent"]}},
                                      "history": {"index": "messages"}})
    yield ev(AgentConfigured, "bench", "big", "cfg-history", config=cfg)
    yield ev(ProfileChanged, "bench", "big", "profile", user=PROFILED, version=1,
             text="Prefers refunds by bank transfer.\nShips to the office address on weekdays.")
    for j in range(LAYER_NOTES):
        sources = [NoteSource(conversation=NOTES_SESSION, id=f"nm{(j * NOTE_SOURCES + k) % 40}") for k in range(NOTE_SOURCES)]
        yield ev(NoteSaved, "bench", "big", f"note{j}", note_id=f"note-{j}", user=PROFILED, revision=1,
                 topic=f"{WORDS[j % 12]} {WORDS[(j + 5) % 12]} handling", session=NOTES_SESSION, sources=sources,
                 summary=f"The {WORDS[j % 12]} case {j}: check the {WORDS[(j + 5) % 12]} first")
    for j in range(SHARED_ENTRIES):
        yield ev(TenantFloorSet, "bench", WORKSPACE, f"floor{j}", entry_id=f"floor-{j}",
                 text=f"Never share a customer's {WORDS[j]} with another customer")
        yield ev(ConventionProposed, "bench", WORKSPACE, f"conv{j}", entry_id=f"conv-{j}", agents=["a1", "a2"],
                 text=f"Every {WORDS[j]} change needs a ticket number")
        yield ev(ConventionApproved, "bench", WORKSPACE, f"conv{j}-ok", entry_id=f"conv-{j}")
        for kind in ("policy", "default"):
            yield ev(PlatformEntrySet, "@platform", WORKSPACE, f"{kind}{j}", entry_id=f"{kind}-{j}", kind=kind,
                     text=f"Platform {kind} {j}: answer in the customer's language")


def _note_turns() -> list[TurnCommitted]:
    """The history session the notes cite: 40 messages of no member, so any member sees them."""
    return [TurnCommitted(event_id=f"nt-{n}", tenant="bench", agent="big", session=NOTES_SESSION, turn=n + 1,
                          execution_id="x1", occurred_at=T0 + timedelta(seconds=n),
                          messages=[Message(id=f"nm{2 * n + i}", role=("user", "assistant")[i],
                                            content=f"message {2 * n + i} about the {WORDS[n % 12]} case")
                                    for i in range(2)])
            for n in range(20)]


async def _with_every_layer(stack, settings) -> None:
    """Writes the shared layers once and waits until a recall as PROFILED shows every one."""
    from projections.redis.record_view import RedisRecords
    from projections.redis.run_view import RunView

    store = RedisRecords(redis_at(settings.redis_url)(pooled=True), namespace=settings.topic_prefix)
    try:
        now = datetime.now(UTC)
        cfg = await store.config("bench", "big")
        if cfg is None or cfg.history is None:
            await _produce(settings, _every_layer_items(settings, now))
            while cfg is None or cfg.history is None:  # the history worker keeps turns of agents with history on
                await asyncio.sleep(0.5)
                cfg = await store.config("bench", "big")
            async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
                await pub.publish_many(_note_turns())
        if not (await RunView(store).session("bench", "big", RUN, now, PROFILED))[0]:
            await _produce(settings, _run_items(settings, now, PROFILED))  # the member's own run
    finally:
        await store.aclose()
    key = await _key(stack, settings)
    headers = {"Authorization": f"Bearer {key}", "X-User": PROFILED, "X-Session": NOTES_SESSION}
    async with httpx.AsyncClient(base_url=stack.api_url, headers=headers, timeout=30) as h:
        while True:
            out = (await h.post("/v1/recall", json={"conversation": f"probe-{uuid.uuid4().hex[:6]}",
                                                     "text": "the refund case", "run_id": RUN})).json()
            missing = [name for name in EVERY_LAYER if not out.get(name)]
            if not missing:
                return
            progress(f"every layer: waiting for {missing}")
            await asyncio.sleep(2)


EVERY_LAYER = ("platformPolicies", "tenantFloors", "userProfile", "sessionSummary", "sessionEntries",
               "workspaceEntries", "notes", "tenantEntries", "platformDefaults")


async def _key(stack, settings) -> str:
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant="bench", agent="big") as op:
        return await op.issue_key("bench", "big")


async def _logged(settings) -> int:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap)
    await c.start()
    try:
        # A fresh deployment has no topics yet, and asking for their offsets would wait out
        # the client's timeout and fail.
        if settings.topic(EVENTS.name) not in await c.topics():
            return 0
        tps = [TopicPartition(settings.topic(EVENTS.name), p) for p in range(EVENTS.partitions)]
        return sum((await c.end_offsets(tps)).values())
    finally:
        await c.stop()


async def _wait_loaded(stack, settings) -> None:
    """Until Qdrant holds every point and Redis lists every record of the measured agent.

    (Counted, not compared with end offsets: transaction markers take offsets too.)"""
    from projections.redis.record_view import RedisRecords

    store = RedisRecords(redis_at(settings.redis_url)(pooled=True), namespace=settings.topic_prefix)
    try:
        async with httpx.AsyncClient(base_url=stack.api_url, timeout=30) as h:
            while True:
                points = (await h.get("/health")).json()["projection"]["points"]
                gen = await store.generation()
                listed = [await store.r.zcard(store._keys(gen, "bench", a)[1]) for a in ("big", "bigu")]
                granted = (await store.subject("bench", "bigu", MEMBER)).consent == "granted"
                if points >= TOTAL and min(listed) >= AGENT_RECORDS and granted:
                    return
                progress(f"indexed {points}/{TOTAL} in Qdrant, {listed}/{AGENT_RECORDS} of the agents' records in "
                         f"Redis, consent {'granted' if granted else 'not seen yet'}")
                await asyncio.sleep(10)
    finally:
        await store.aclose()


def _check_records(records: list[dict], user: str | None) -> None:
    """A recall found something, and as `user` only that member's records."""
    assert records, "recall found nothing: the loaded deployment is incomplete"
    if user is not None:
        theirs = [r for r in records if r["user"] == user and _owner(int(r["id"][1:]))[1] == user]
        assert len(theirs) == len(records), f"a recall as {user} returned another member's or the agent's records"
        # The facts block holds every live fact that fits its 8,000 characters, not a search's page.
        assert len(records) > SearchConfig().max_results, f"the facts block showed only {len(records)} facts"


async def _measure(stack, key: str, suffix: str, user: str | None = None, run_id: str | None = None,
                   every_layer: bool = False) -> None:
    headers = {"Authorization": f"Bearer {key}"} | ({"X-User": user} if user else {})
    if every_layer:  # as the member whose profile and notes there are, in the session the notes cite
        headers |= {"X-User": PROFILED, "X-Session": NOTES_SESSION}
    lat, no_embed, shown = [], [], []
    layered = 0  # recalls that showed an episode or a procedure beside the facts
    shown_notes = 0  # recalls that showed a note (a note is shown when it shares words with the text)
    run = uuid.uuid4().hex[:8]  # recall skips what a conversation already saw: fresh ones each run
    async with httpx.AsyncClient(base_url=stack.api_url, headers=headers, timeout=30) as h:
        for q in range(QUERIES + WARMUP):
            # Every text distinct (the run id too): a repeated text would hit the API's
            # embedding cache, and the figure must include a real query embedding.
            text = f"what about the {WORDS[q % 12]} {WORDS[(q * 7) % 12]} of request {q} {run}?"
            body = {"conversation": f"c{q}-{run}", "text": text} | ({"run_id": run_id} if run_id else {})
            t = time.perf_counter()
            r = await h.post("/v1/recall", json=body)
            ms = (time.perf_counter() - t) * 1000
            r.raise_for_status()
            out = r.json()
            _check_records(out["workspaceEntries"], user)
            shown.append(len(out["workspaceEntries"]))
            if run_id:
                assert out["sessionSummary"] and out["sessionEntries"], "the run's session memory was not recalled"
                layered += bool(out["relevantEpisodes"] or out["procedures"] or out["antiPatterns"])
            if every_layer:
                missing = [name for name in EVERY_LAYER if name != "notes" and not out.get(name)]
                assert not missing, f"a recall with every layer lacked {missing}"
                shown_notes += bool(out["notes"])
            embed_ms = float(r.headers["server-timing"].split("dur=")[1])
            if q >= WARMUP:
                lat.append(ms)
                no_embed.append(ms - embed_ms)
        extra = {"total_records": TOTAL}
        if user is not None:
            extra |= {"live_facts_per_member": AGENT_RECORDS // USERS, "facts_shown_p50": percentile(shown, 50)}
        if run_id:
            assert layered, "no recall showed an episode or a procedure"
            extra |= {"layer_records": 2 * LAYER_RECORDS, "recalls_with_episodes_or_procedures": layered}
        if every_layer:
            assert shown_notes, "no recall showed a note"
            extra |= {"shared_entries_each": SHARED_ENTRIES, "notes": LAYER_NOTES, "note_sources": NOTE_SOURCES,
                      "recalls_with_notes": shown_notes}
        figure(f"recall_ms_p50_100k{suffix}", percentile(lat, 50), "ms", AGENT_RECORDS, **extra)
        figure(f"recall_ms_p95_100k{suffix}", percentile(lat, 95), "ms", AGENT_RECORDS, **extra)
        figure(f"recall_ms_p99_100k{suffix}", percentile(lat, 99), "ms", AGENT_RECORDS, **extra)
        figure(f"recall_ms_p95_100k_no_embed{suffix}", percentile(no_embed, 95), "ms", AGENT_RECORDS, **extra)
        progress(f"{len(lat)} sequential recalls measured")

        async def worker(w: int, count: int) -> None:
            for q in range(count):
                body = {"conversation": f"w{w}-{q}-{run}", "text": f"{WORDS[(w + q) % 12]} note {w} {q} {run}"}
                r = await h.post("/v1/recall", json=body)
                r.raise_for_status()
                _check_records(r.json()["workspaceEntries"], user)

        t = time.perf_counter()
        await asyncio.gather(*(worker(w, 25) for w in range(8)))
        figure(f"recall_per_s_concurrent{suffix}", 200 / (time.perf_counter() - t), "recalls/s", AGENT_RECORDS,
               concurrency=8, **extra)


async def run() -> None:
    # A kept deployment needs no ledger: left running, it would fold 1M events while we measure.
    kept = await _logged(Settings(topic_prefix=f"bench{DEPLOYMENT}.")) >= TOTAL
    # The history worker keeps the session the notes cite (`_with_every_layer`).
    workers = ("redis-projection", "history") if kept else ("ledger", "redis-projection", "history")
    # The bench builds the optimized generation itself: the API's own optimizer would build one
    # at the same time from the same shard.
    with bench_stack(DEPLOYMENT, workers=workers, keep=True,
                     env={"MEMLANE_OPTIMIZE_UNINDEXED_POINTS": str(10**12)}) as (stack, settings):
        async with MemlaneClient(stack.api_url, settings.operator_key, tenant="bench", agent="big") as op:
            key = await op.issue_key("bench", "big")
            if not kept:
                await op.configure({"memory": {"scope": {"read": ["agent"], "write": ["agent"]}}, "has_sessions": False})
        async with MemlaneClient(stack.api_url, settings.operator_key, tenant="bench", agent="bigu") as op:
            user_key = await op.issue_key("bench", "bigu")
            if not kept:
                await op.configure({"memory": {"consent": "required", "scope": {"read": ["user"], "write": ["user"]},
                                               "recall": {"format": "facts"}}, "has_sessions": False})
        t0 = time.perf_counter()
        if not kept:
            await _produce(settings, _items(settings))
            progress(f"wrote {TOTAL} records to the log in {time.perf_counter() - t0:.0f} s; waiting for the index")
            await _wait_loaded(stack, settings)
            figure("recall_index_load_records_per_s", TOTAL / (time.perf_counter() - t0), "records/s", TOTAL)
        else:
            progress("reusing the deployment loaded by an earlier run")
            await _wait_loaded(stack, settings)
        if index_generations(settings).current() < 2:
            await _measure(stack, key, "_unoptimized")
            await _measure(stack, user_key, "_unoptimized_user_scope", MEMBER)
            # Build the per-agent HNSW graphs offline in the next generation; the server swaps to it.
            t1 = time.perf_counter()
            await rebuild_all(settings, redis_at(settings.redis_url), index_generations(settings), keys_at(settings), optimize=True,
                              targets=("qdrant",))
            async with httpx.AsyncClient(base_url=stack.api_url) as h:
                while (await h.get("/health", timeout=30)).json()["projection"]["generation"] < 2:
                    await asyncio.sleep(2)
            figure("recall_optimize_s", time.perf_counter() - t1, "s", TOTAL,
                   note="rebuild --optimize: replay the log into a new shard, then build per-agent graphs")
        await _measure(stack, key, "")
        await _measure(stack, user_key, "_user_scope", MEMBER)
        await _with_layers(stack, settings)
        await _measure(stack, key, "_layers", run_id=RUN)
        await _with_every_layer(stack, settings)
        await _measure(stack, key, "_every_layer", run_id=RUN, every_layer=True)
        await _measure(stack, key, "_again")  # the same as the first figure, after: the machine's drift
