"""history on LongMemEval_S (part of `make bench ONLY=history`): each question's haystack (about
50 sessions, 500 messages, many long) published as one session of turn events through Kafka;
each question searched through HTTP in every mode, beside a plain BM25 (bm25s, English
stopwords) over the same messages in this process. Figures per half (`tuning`, `validation`):
turn recall@5/10/25 (the evidence messages among the top k of a 25-part page, one message counted
once), session recall_all@5 (the first five sessions the page names, as LongMemEval reads
it; also over the top five messages alone), and each mode's search latency."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

import httpx
import numpy as np

from events.codec import encode
from events.topics import TURNS
from services.client import TurnPublisher
from tests.bench import longmemeval as lme
from tests.bench.common import figure, median, percentile, progress
from tests.bench.tune_longmemeval import LIMIT, Question, bm25s_ranked
from tests.conftest import eventually

MODES = ("hybrid", "lexical", "vector")


async def ingest(stack, settings, items, tenant: str, agent: str, key: str, already: int) -> int:
    """Publishes every haystack and waits until the history index holds it; returns the turns."""
    turns = [t for item in items for t in lme.turns(item, tenant, agent)]
    progress(f"LongMemEval: publishing {len(turns)} turns of {len(items)} haystacks")
    t0 = time.perf_counter()
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
        for start in range(0, len(turns), 2000):
            futs = [await pub.producer.send(pub.topic, encode(t), key=TURNS.key_bytes(t)) for t in turns[start:start + 2000]]
            await asyncio.gather(*futs)
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=30) as http:
        async def indexed() -> bool:
            st = (await http.get("/v1/history/status")).json()
            progress(f"LongMemEval: indexed {st['turns'] - already}/{len(turns)} turns ({st['points']} points)")
            return st["turns"] - already >= len(turns)

        await eventually(indexed, timeout=3600, interval=2)
        for item in items:  # the last message of each haystack is searchable
            async def searchable(item=item) -> bool:
                r = await http.post("/v1/history/search", json={"ids": [lme.last_message_id(item)]},
                                    headers={"Authorization": f"Bearer {key}", "X-Session": item["question_id"]})
                return bool(r.json()["events"])

            await eventually(searchable, timeout=120, interval=0.2)
    figure("lme_history_index_turns_per_s", len(turns) / (time.perf_counter() - t0), "turns/s", len(turns))
    return len(turns)


async def recall(stack, items, key: str) -> None:
    halves = lme.split(items)
    half_of = {x["question_id"]: h for h, xs in halves.items() for x in xs}
    got: dict[tuple[str, str, str], list[float]] = defaultdict(list)  # (half, mode, measure) -> per question
    lat: dict[str, list[float]] = {m: [] for m in MODES}
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=60, headers={"Authorization": f"Bearer {key}"}) as http:
        first: dict[tuple[str, str], list[str]] = {}
        # Twice: the first pass scores, the second (a warmed service, every mode on the same
        # footing) is timed and must rank the same.
        for timed in (False, True):
            for mode in MODES:
                for item in items:
                    t0 = time.perf_counter()
                    r = await http.post("/v1/history/search", headers={"X-Session": item["question_id"]},
                                        json={"query": item["question"], "limit": LIMIT, "mode": mode,
                                              "now": int(lme.asked_at(item).timestamp() * 1000)})
                    if timed:
                        lat[mode].append((time.perf_counter() - t0) * 1000)
                    r.raise_for_status()
                    events = r.json()["events"]
                    # Every haystack holds far more than a page; a lexical search finds only the parts
                    # that share a word with the question.
                    if len(events) != LIMIT and not (mode == "lexical" and events):
                        raise RuntimeError(f"a {mode} search of {item['question_id']} returned {len(events)} parts")
                    ranked = list(dict.fromkeys(e["id"] for e in events))
                    if timed:
                        if ranked != first[(mode, item["question_id"])]:
                            raise RuntimeError(f"a second {mode} search of {item['question_id']} ranked differently")
                        continue
                    first[(mode, item["question_id"])] = ranked
                    for measure, v in lme.scores(ranked, item).items():
                        got[(half_of[item["question_id"]], mode, measure)].append(v)
                progress(f"LongMemEval {mode}{' again' if timed else ''}: {len(items)} questions")
    for item in items:
        for measure, v in lme.scores(bm25s_ranked(Question(item)), item).items():
            got[(half_of[item["question_id"]], "bm25s", measure)].append(v)
    for (half, mode, measure), xs in sorted(got.items()):
        if measure in lme.REPORTED:
            figure(f"lme_{lme.REPORTED[measure]}_{half}_{mode}", 100 * float(np.mean(xs)), "%", len(xs))
    for mode in MODES:
        figure(f"lme_history_search_http_ms_p50_{mode}", median(lat[mode]), "ms", len(lat[mode]))
        figure(f"lme_history_search_http_ms_p95_{mode}", percentile(lat[mode], 95), "ms", len(lat[mode]))
    figure("lme_history_search_http_hybrid_to_lexical_p95", percentile(lat["hybrid"], 95)
           / percentile(lat["lexical"], 95), "ratio", len(lat["hybrid"]))
