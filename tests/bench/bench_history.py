"""history: session history measured on LoCoMo.

- Ingest: each LoCoMo conversation of ../shared/data/locomo/locomo_dev.json becomes one
  session of turn events through Kafka; each utterance a message whose id is its
  `dia_id`, timed by its session's date. Two utterances make a turn.
- Recall: for every QA item, search the session with the question; evidence recall@k is
  the share of the item's evidence dia_ids among the top k events, averaged over items.
  Anchor (LoCoMo paper, Table 3, DRAGON, dialog level): @5 56.7, @10 66.2, @25 76.7.
- LongMemEval_S (`tests.bench.bench_longmemeval`): the same, on long agent histories, beside a
  plain BM25 over the same messages.
- Speed: turns indexed per second (both history projections caught up), and search
  latency over a shard of 100,000 synthetic kept events (in process: query embedding
  plus the hybrid Edge query, the work one HTTP search does besides HTTP itself).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import tempfile
import time
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import numpy as np

from events import AgentConfig, Message, TurnCommitted
from events.codec import encode
from events.topics import TURNS
from services.client import MemlaneClient, TurnPublisher
from settings import ROOT
from tests.bench import bench_longmemeval as longmemeval_bench
from tests.bench import longmemeval
from tests.bench.common import bench_stack, figure, median, percentile, progress

DATA = ROOT.parent / "shared" / "data" / "locomo" / "locomo_dev.json"
CATEGORIES = {1: "multi_hop", 2: "temporal", 3: "open_domain", 4: "single_hop", 5: "adversarial"}
KS = (5, 10, 25)
# The tuning protocol: every ranking parameter is chosen on the tuning conversations alone, and
# the validation ones are only reported (never looked at while tuning).
SPLITS = {"tuning": ("conv-26", "conv-30", "conv-41", "conv-42"), "validation": ("conv-43", "conv-44", "conv-47")}
MODES = ("hybrid", "lexical", "vector")
SYNTHETIC = 100_000


def session_time(s: str) -> datetime:
    return datetime.strptime(s, "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)


def utterance_text(u: dict) -> str:
    text = f"{u['speaker']}: {u['text']}"
    if u.get("blip_caption"):
        text += f" [shares a photo: {u['blip_caption']}]"
    return text


def conversation_turns(conv: dict, tenant: str, agent: str) -> list[TurnCommitted]:
    c = conv["conversation"]
    speaker_a = c["speaker_a"]
    numbers = sorted(int(m.group(1)) for k in c if (m := re.fullmatch(r"session_(\d+)", k)) and c[k])
    turns: list[TurnCommitted] = []
    for n in numbers:
        start = session_time(c[f"session_{n}_date_time"])
        utts = c[f"session_{n}"]
        for i in range(0, len(utts), 2):
            msgs = [
                Message(id=u["dia_id"], role="user" if u["speaker"] == speaker_a else "assistant",
                        content=utterance_text(u))
                for u in utts[i : i + 2]
            ]
            turns.append(
                TurnCommitted(
                    event_id=str(uuid.uuid4()),
                    tenant=tenant,
                    agent=agent,
                    session=conv["sample_id"],
                    turn=len(turns) + 1,
                    execution_id=f"{conv['sample_id']}-s{n}",
                    occurred_at=start + timedelta(seconds=i),
                    messages=msgs,
                )
            )
    return turns


def asked_at(conv: dict) -> datetime:
    """When the questions are asked: a minute after the conversation's last turn."""
    return conversation_turns(conv, "t", "a")[-1].occurred_at + timedelta(minutes=1)


def evidence(qa: dict) -> set[str]:
    out = set()
    for raw in qa.get("evidence", []):
        for e in raw.split(";"):
            e = e.strip().replace("D:", "D")
            if re.fullmatch(r"D\d+:\d+", e):
                out.add(e)
    return out


async def ingest(stack, settings, data, tenant, agent, key) -> int:
    """Publish every conversation and wait until both history projections hold it all;
    returns the events the search index keeps (the size the search figures are measured at)."""
    turns = [t for conv in data for t in conversation_turns(conv, tenant, agent)]
    last = {conv["sample_id"]: t.messages[-1].id for conv in data for t in conversation_turns(conv, tenant, agent)[-1:]}
    progress(f"publishing {len(turns)} turns ({sum(len(t.messages) for t in turns)} utterances) of {len(data)} conversations")
    t0 = time.perf_counter()
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
        futs = [await pub.producer.send(pub.topic, encode(t), key=TURNS.key_bytes(t)) for t in turns]
        await asyncio.gather(*futs)
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=30) as http:
        while True:
            st = (await http.get("/v1/history/status")).json()
            progress(f"indexed {st['turns']}/{len(turns)} turns ({st['points']} points)")
            if st["turns"] >= len(turns):
                kept = st["events"]
                break
            await asyncio.sleep(0.5)
        for session, dia in last.items():
            while True:
                r = await http.post("/v1/history/search", json={"ids": [dia]},
                                    headers={"Authorization": f"Bearer {key}", "X-Session": session})
                if r.json()["events"]:
                    break
                await asyncio.sleep(0.2)
    elapsed = time.perf_counter() - t0
    utterances = sum(len(t.messages) for t in turns)
    if kept != utterances:  # the agent keeps every message: a shortfall was lost on the way
        raise RuntimeError(f"the history index keeps {kept} events of {utterances} utterances published")
    figure("history_index_turns_per_s", len(turns) / elapsed, "turns/s", len(turns), events=utterances)
    return kept


async def recall(stack, data, key, kept: int) -> None:
    items = [(conv["sample_id"], qa) for conv in data for qa in conv["qa"] if evidence(qa)]
    asked = {conv["sample_id"]: int(asked_at(conv).timestamp() * 1000) for conv in data}
    skipped = sum(len(conv["qa"]) for conv in data) - len(items)
    progress(f"{len(items)} QA items with evidence ({skipped} without); 3 modes")
    scores: dict[str, dict[tuple, list[float]]] = {m: defaultdict(list) for m in MODES}
    lat: list[float] = []
    warm: dict[str, list[float]] = {m: [] for m in MODES}
    first: dict[tuple[str, str, str], list[str]] = {}
    sem = asyncio.Semaphore(3)
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=60,
                                 headers={"Authorization": f"Bearer {key}"}) as http:

        async def one(session: str, qa: dict, mode: str, timed: list[float] | None = None) -> None:
            async with sem:
                t0 = time.perf_counter()
                r = await http.post("/v1/history/search", json={"query": qa["question"], "limit": 25, "mode": mode,
                                                                 "now": asked[session]},
                                    headers={"X-Session": session})
                if timed is not None:
                    timed.append((time.perf_counter() - t0) * 1000)
                elif mode == "hybrid":
                    lat.append((time.perf_counter() - t0) * 1000)
            r.raise_for_status()
            ranked = list(dict.fromkeys(e["id"] for e in r.json()["events"]))
            if timed is not None:  # the second pass: the same answers, only timed
                if ranked != first[(session, qa["question"], mode)]:
                    raise RuntimeError(f"a second {mode} search for {qa['question']!r} ranked differently")
                return
            first[(session, qa["question"], mode)] = ranked
            ev = evidence(qa)
            split = next(name for name, convs in SPLITS.items() if session in convs)
            for k in KS:
                share = len(ev & set(ranked[:k])) / len(ev)
                for key in (("all", k), (qa["category"], k), (split, k), ((split, qa["category"]), k)):
                    scores[mode][key].append(share)

        for mode in MODES:
            t0 = time.perf_counter()
            for start in range(0, len(items), 100):
                await asyncio.gather(*(one(s, qa, mode) for s, qa in items[start : start + 100]))
                progress(f"{mode}: {min(start + 100, len(items))}/{len(items)} questions")
            progress(f"{mode} done in {time.perf_counter() - t0:.1f} s")
        # Each mode again: the first hybrid pass ran right after the bulk indexing, reading
        # each place and page of the shard for the first time; these time a warmed service,
        # every mode on the same footing.
        for mode in MODES:
            for start in range(0, len(items), 100):
                await asyncio.gather(*(one(s, qa, mode, warm[mode]) for s, qa in items[start : start + 100]))
            progress(f"{mode} again: {len(warm[mode])} searches, the same answers")
    n = len(items)
    for k in KS:
        figure(f"history_recall_at_{k}", 100 * np.mean(scores["hybrid"][("all", k)]), "%", n, anchor_dragon={5: 56.7, 10: 66.2, 25: 76.7}[k])
    for mode in MODES:
        for k in KS:
            figure(f"history_recall_at_{k}_{mode}", 100 * np.mean(scores[mode][("all", k)]), "%", n)
    for cat, name in CATEGORIES.items():
        for k in KS:
            xs = scores["hybrid"][(cat, k)]
            if xs:
                figure(f"history_recall_at_{k}_cat{cat}_{name}", 100 * np.mean(xs), "%", len(xs))
    for split, convs in SPLITS.items():
        for mode in MODES:
            for k in KS:
                xs = scores[mode][(split, k)]
                suffix = split if mode == "hybrid" else f"{split}_{mode}"
                figure(f"history_recall_at_{k}_{suffix}", 100 * np.mean(xs), "%", len(xs), conversations=list(convs))
        for cat, name in CATEGORIES.items():
            for k in KS:
                xs = scores["hybrid"][((split, cat), k)]
                if xs:
                    figure(f"history_recall_at_{k}_{split}_cat{cat}_{name}", 100 * np.mean(xs), "%", len(xs))
    figure("history_search_http_ms_p50", median(lat), "ms", len(lat), kept_events=kept)
    figure("history_search_http_ms_p95", percentile(lat, 95), "ms", len(lat), kept_events=kept)
    for mode in MODES:
        suffix = "" if mode == "hybrid" else f"_{mode}"
        figure(f"history_search_http_ms_p50_warm{suffix}", median(warm[mode]), "ms", len(warm[mode]), kept_events=kept)
        figure(f"history_search_http_ms_p95_warm{suffix}", percentile(warm[mode], 95), "ms", len(warm[mode]),
               kept_events=kept)
    figure("history_search_http_hybrid_to_lexical_p95", percentile(warm["hybrid"], 95)
           / percentile(warm["lexical"], 95), "ratio", len(warm["hybrid"]), kept_events=kept)


def speed_at_scale() -> None:
    """Search latency with 100,000 kept events in one session (the worst case for its filter)."""
    from events.rules.history import HistoryFilter, KeptEvent
    from projections.embedders.onnx import OnnxMiniLM
    from projections.qdrant.history_index import HistoryIndex, event_parts

    rng = random.Random(7)
    nrng = np.random.default_rng(7)
    words = [f"w{i}" for i in range(3000)] + "deploy budget calendar kestrel runbook owner window release".split()
    with tempfile.TemporaryDirectory() as tmp:
        index = HistoryIndex(Path(tmp) / "history-g1")
        t0 = time.perf_counter()
        for start in range(0, SYNTHETIC, 5000):
            rows = []
            vecs = nrng.standard_normal((5000, 384)).astype(np.float32)
            vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
            for i in range(start, start + 5000):
                e = KeptEvent(id=f"e{i}", tenant="t", agent="a", session="big", turn=i // 2 + 1, attempt=1,
                              execution_id="x", sequence=i % 2, role="user" if i % 2 == 0 else "assistant",
                              kind="message", text=" ".join(rng.choices(words, k=14)), preview=False,
                              occurred_ms=1_700_000_000_000 + i * 1000)
                [(pid, payload)] = event_parts(e)
                rows.append((pid, payload, vecs[i - start].tolist()))
            index.upsert(rows)
            progress(f"synthetic shard: {start + 5000}/{SYNTHETIC} events ({time.perf_counter() - t0:.0f} s)")
        index.flush()
        if index.count() != SYNTHETIC:
            raise RuntimeError(f"the synthetic shard holds {index.count()} points, not {SYNTHETIC}")
        emb = OnnxMiniLM()
        emb.embed(["warm up"])
        queries = [" ".join(rng.choices(words, k=6)) for _ in range(300)]
        f = HistoryFilter("t", "a", "big", False, ("message",), before_turn=SYNTHETIC // 2)
        lat = []
        for i, q in enumerate(queries):
            t1 = time.perf_counter()
            dense = emb.embed([q])[0]
            hits = index.search(f, dense, q, 11, 0, "hybrid")
            if i >= 20:  # the first queries warm caches
                lat.append((time.perf_counter() - t1) * 1000)
            _check_hits(hits, f, q)
        index.close()
    figure("history_search_ms_p50", median(lat), "ms", len(lat), kept_events=SYNTHETIC)
    figure("history_search_ms_p95", percentile(lat, 95), "ms", len(lat), kept_events=SYNTHETIC)


def _check_hits(hits, f, query: str) -> None:
    """A timed search found a full page inside its filter, the query's words among it: a
    search that returned nothing, or ignored the filter, would time faster."""
    words = set(query.split())
    if len(hits) != 11:
        raise RuntimeError(f"a search over the synthetic shard found {len(hits)} events, not 11")
    if not all(h.payload["session"] == f.session and h.payload["turn"] < f.before_turn for h in hits):
        raise RuntimeError("a search over the synthetic shard found events outside its filter")
    if not any(words & set(h.payload["text"].split()) for h in hits):
        raise RuntimeError("a hybrid search over the synthetic shard found no event with a word of its query")


async def run() -> None:
    data = json.loads(DATA.read_text())
    with bench_stack("history") as (stack, settings):
        tenant, agent = "bench", f"a{uuid.uuid4().hex[:6]}"
        async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
            key = await op.issue_key(tenant, agent)
            await op.configure(AgentConfig.model_validate({"history": {"index": "messages"}}))
        kept = await ingest(stack, settings, data, tenant, agent, key)
        await recall(stack, data, key, kept)
        items = longmemeval.load()
        await longmemeval_bench.ingest(stack, settings, items, tenant, agent, key,
                                       sum(len(conversation_turns(c, tenant, agent)) for c in data))
        await longmemeval_bench.recall(stack, items, key)
    await asyncio.to_thread(speed_at_scale)
