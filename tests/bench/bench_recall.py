"""recall: latency over HTTP with 100,000 records in one agent, synthetic seeded vectors
written through the normal projection path (events + vectors topics -> Redis and Qdrant)."""

from __future__ import annotations

import asyncio
import os
import time
from datetime import UTC, datetime, timedelta

import httpx
import numpy as np

from events import RecordAdded, encode
from events.record import MemoryRecord
from events.topics import EVENTS, VECTORS
from events.vectors import VectorComputed
from projections.embedder import MODEL_ID, content_hash
from services.client import MemlaneClient
from tests.bench.bench_rebuild import _produce
from tests.bench.common import bench_stack, figure, percentile, progress
from workers.rebuild import rebuild_qdrant

AGENT_RECORDS = 100_000
TOTAL = int(os.environ.get("MEMLANE_BENCH_RECALL_TOTAL", "200000"))
QUERIES = 200
OPTIMIZE = os.environ.get("MEMLANE_BENCH_RECALL_OPTIMIZE") == "1"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
WORDS = "invoice shipping refund parcel customer account password billing order delivery address contract".split()


def _items(settings):
    rng = np.random.default_rng(42)
    for i in range(TOTAL):
        agent = "big" if i < AGENT_RECORDS else f"other{i % 500}"
        text = f"{WORDS[i % 12]} {WORDS[(i // 12) % 12]} note {i} for {agent}"
        vec = rng.standard_normal(384).astype(np.float32)
        vec /= np.linalg.norm(vec)
        v = VectorComputed.of(MODEL_ID, content_hash(text), vec)
        yield settings.topic(VECTORS.name), VECTORS.key_bytes(v), encode(v)
        r = MemoryRecord(id=f"r{i}", version=1, created=T0 + timedelta(seconds=i), modified=T0, tenant="bench",
                         agent=agent, scope="AGENT", kind="fact", summary=text)
        e = RecordAdded(event_id=f"e{i}", command_id=f"c{i}", tenant="bench", agent=agent, occurred_at=T0, record=r)
        yield settings.topic(EVENTS.name), EVENTS.key_bytes(e), encode(e)


async def run() -> None:
    with bench_stack("recall", workers=("ledger", "redis-projection")) as (stack, settings):
        async with MemlaneClient(stack.api_url, settings.operator_key, tenant="bench", agent="big") as op:
            key = await op.issue_key("bench", "big")
            await op.configure({"memory": {"scope": {"read": ["agent"], "write": ["agent"]}}, "has_sessions": False})
        t0 = time.perf_counter()
        await _produce(settings, _items(settings))
        progress(f"wrote {TOTAL} records to the log in {time.perf_counter() - t0:.0f} s; waiting for the index")
        async with httpx.AsyncClient(base_url=stack.api_url) as h:
            while (points := (await h.get("/health")).json()["projection"]["points"]) < TOTAL:
                progress(f"indexed {points}/{TOTAL}")
                await asyncio.sleep(5)
        figure("recall_index_load_records_per_s", TOTAL / (time.perf_counter() - t0), "records/s", TOTAL)
        suffix = ""
        if OPTIMIZE:
            # Build the HNSW index offline in the next generation; the server swaps to it.
            t1 = time.perf_counter()
            await rebuild_qdrant(settings, optimize=True)
            async with httpx.AsyncClient(base_url=stack.api_url) as h:
                while (await h.get("/health", timeout=30)).json()["projection"]["generation"] < 2:
                    await asyncio.sleep(2)
            progress(f"optimized generation built and switched in {time.perf_counter() - t1:.0f} s")
            suffix = "_optimized"
        headers = {"Authorization": f"Bearer {key}"}
        lat, no_embed = [], []
        async with httpx.AsyncClient(base_url=stack.api_url, headers=headers, timeout=30) as h:
            for q in range(QUERIES + 10):
                body = {"conversation": f"c{q}", "text": f"what about the {WORDS[q % 12]} {WORDS[(q * 7) % 12]}?"}
                t = time.perf_counter()
                r = await h.post("/v1/recall", json=body)
                ms = (time.perf_counter() - t) * 1000
                r.raise_for_status()
                embed_ms = float(r.headers["server-timing"].split("dur=")[1])
                if q >= 10:
                    lat.append(ms)
                    no_embed.append(ms - embed_ms)
            n = len(lat)
            figure(f"recall_ms_p50_100k{suffix}", percentile(lat, 50), "ms", AGENT_RECORDS, total_records=TOTAL)
            figure(f"recall_ms_p95_100k{suffix}", percentile(lat, 95), "ms", AGENT_RECORDS, total_records=TOTAL)
            figure(f"recall_ms_p99_100k{suffix}", percentile(lat, 99), "ms", AGENT_RECORDS, total_records=TOTAL)
            figure(f"recall_ms_p95_100k_no_embed{suffix}", percentile(no_embed, 95), "ms", AGENT_RECORDS, total_records=TOTAL)
            progress(f"{n} sequential recalls measured")

            async def worker(w: int, count: int) -> None:
                for q in range(count):
                    body = {"conversation": f"w{w}-{q}", "text": f"{WORDS[(w + q) % 12]} note"}
                    (await h.post("/v1/recall", json=body)).raise_for_status()

            t = time.perf_counter()
            await asyncio.gather(*(worker(w, 25) for w in range(8)))
            figure(f"recall_per_s_concurrent{suffix}", 200 / (time.perf_counter() - t), "recalls/s", AGENT_RECORDS,
                   concurrency=8, total_records=TOTAL)
