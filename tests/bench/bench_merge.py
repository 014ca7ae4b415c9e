"""`make bench ONLY=merge`: the API-side near-duplicate check of a direct write (embed the
text, search the nearest live records of its scope, word overlap and vetoes) on an agent
holding 10k records, and the rule's precision and recall on the labelled pairs.

In process, on a Qdrant Edge shard and the local MiniLM embedder as `memlane serve` uses them;
the record view is a dict here (the serve path reads the hits' records from Redis in one call).
The figures are printed only once the check found every planted duplicate and merged none of
the different facts."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from events.commands import AddMemory
from events.config import AgentConfig
from events.record import MemoryRecord, Scope
from events.rules import near_duplicate as nd
from projections.embedders.onnx import OnnxMiniLM
from projections.qdrant.index import EdgeIndex
from services.memory.merge import MergeCheck
from tests.bench.common import figure, percentile, progress

N = 10_000
WRITES = 200
T0 = datetime(2026, 3, 1, tzinfo=UTC)
PAIRS = Path(__file__).parent.parent / "data" / "near_duplicates.jsonl"
SUBJECTS = ["The user", "The user's sister", "The customer", "The team", "The project", "Dana", "The manager"]
VERBS = ["prefers", "lives in", "works with", "uses", "needs", "visits", "owns", "mentions"]


def _text(i: int) -> str:
    return f"{SUBJECTS[i % 7]} {VERBS[(i // 7) % 8]} item {i} of catalogue {i // 56}"


class _Records:
    def __init__(self, recs: dict[str, MemoryRecord]) -> None:
        self.recs = recs

    async def get_many(self, tenant: str, agent: str, ids: list[str]) -> list[MemoryRecord]:
        return [self.recs[i] for i in ids if i in self.recs]


class _Shards:
    """`MemoryShards.search` of one Edge shard."""

    def __init__(self, index: EdgeIndex) -> None:
        self.index = index

    def search(self, f, dense, text, limit, mode="hybrid", min_score=0.0):
        return self.index.search(f, dense, text, limit, mode, min_score)


def _record(i: int, text: str) -> MemoryRecord:
    return MemoryRecord(id=f"r{i}", version=1, created=T0, modified=T0, tenant="t", agent="a", scope=Scope.AGENT,
                        kind="fact", summary=text)


def _labelled(emb: OnnxMiniLM) -> dict[str, tuple[float, float]]:
    rows = [json.loads(line) for line in PAIRS.read_text().splitlines() if line.strip()]
    a, b = np.array(emb.embed([r["a"] for r in rows])), np.array(emb.embed([r["b"] for r in rows]))
    out = {}
    for part in ("tune", "check"):
        tp = fp = fn = 0
        for r, s in zip(rows, (a * b).sum(axis=1).tolist()):
            if r["split"] != part:
                continue
            merged = nd.decide(r["a"], r["b"], s, timedelta(minutes=5))
            tp, fp, fn = tp + (merged and r["merge"]), fp + (merged and not r["merge"]), fn + (not merged and r["merge"])
        out[part] = (tp / (tp + fp), tp / (tp + fn))
    return out


async def run() -> None:
    emb = OnnxMiniLM()
    progress(f"merge: embedding {N} records")
    texts = [_text(i) for i in range(N)]
    vecs = emb.embed(texts)
    recs = {f"r{i}": _record(i, t) for i, t in enumerate(texts)}
    with tempfile.TemporaryDirectory() as d:
        index = EdgeIndex(Path(d) / "shard")
        index.upsert([(recs[f"r{i}"], v) for i, v in enumerate(vecs)])
        index.flush()
        check = MergeCheck(_Records(recs), emb)
        cfg = AgentConfig.model_validate({"memory": {"scope": {"read": ["agent"], "write": ["agent"]}}})
        # Half the writes restate a stored record (a trailing "now", a period), half state a
        # different fact in the same words (another item number).
        times, found, wrong = [], 0, 0
        for w in range(WRITES):
            i = (w * 37) % N
            dup = w % 2 == 0
            summary = f"{texts[i]} now." if dup else _text(i).replace(f"item {i} ", f"item {i + N} ")
            cmd = AddMemory(command_id=f"w{w}", tenant="t", agent="a", issued_at=T0 + timedelta(hours=1),
                            summary=summary, scope=Scope.AGENT)
            t = time.perf_counter()
            ev = await check.evidence(cmd, cfg, _Shards(index))
            times.append((time.perf_counter() - t) * 1000)
            found += dup and ev is not None and ev.record_id == f"r{i}"
            wrong += (not dup) and ev is not None
        index.close()
    if found != WRITES // 2 or wrong:
        raise SystemExit(f"merge bench: found {found} of {WRITES // 2} planted duplicates, merged {wrong} "
                         "different facts; no figures")
    figure("merge_check_ms_p95", percentile(times, 95), "ms", WRITES, records=N)
    figure("merge_check_ms_p50", percentile(times, 50), "ms", WRITES, records=N)
    for part, (p, r) in _labelled(emb).items():
        figure(f"merge_precision_{part}", p, "ratio", 50, embedder="local")
        figure(f"merge_recall_{part}", r, "ratio", 50, embedder="local")


if __name__ == "__main__":
    asyncio.run(run())
