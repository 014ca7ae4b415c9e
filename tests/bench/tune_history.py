"""The history ranking's tuning protocol, in process: `python -m tests.bench.tune_history [--validation]`.

Ranks LoCoMo's utterances for every question without a stack, as the history shard would:
MiniLM vectors (computed once, cached under the system's temp directory), Edge's own BM25
tokenizer with IDF over every conversation (as one shard holds them), each list cut at
`LEXICAL_DEPTH` and `HYBRID_DEPTH`, then `projections.qdrant.ranking`, each question asked a
minute after its conversation's last turn. It prints evidence
recall@5/10/25 for a grid of weights on the tuning conversations only; `--time`, for the time
prior's weight and each category without and with it; `--bm25`, for BM25's average length
(lexical alone, hybrid, multi-hop and open-domain); `--depths`, for a grid of
the two lists' depths with the chosen weights; `--memory`, memory-record search's fusion (no
neighbours, memory's depth) against the RRF it replaced, on both splits; `--validation` prints
the chosen weights and depths on the validation ones, which nothing here tunes on. The figures that count are `make bench
ONLY=history`'s, through Kafka and HTTP (docs/decisions/0019-history-ranking-score-fusion.md).
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter, defaultdict
from typing import Any

import numpy as np

from events.rules import named_time
from projections.qdrant import ranking
from projections.qdrant.history_index import HYBRID_DEPTH, LEXICAL_DEPTH, bm25_config
from projections.qdrant.ranking import Place
from tests.bench.bench_history import CATEGORIES, DATA, KS, SPLITS, asked_at, conversation_turns, evidence
from tests.bench.common import embedded

GRID = [(w, n) for w in (0.5, 0.6, 0.7, 0.8) for n in (0.0, 0.2, 0.3, 0.4, 0.5)]
DEPTHS = [(lx, dn) for lx in (30, 50, 100, 200) for dn in (100, 150, 200)]  # (lexical, dense)
BM25_AVG_LENS = (16.0, 32.0, 64.0, 96.0, 128.0, 160.0, 192.0, 256.0, 512.0)  # Edge's default is 256
MEMORY_DEPTH = 40  # memory search's max(4 x limit, 20) for a limit of 10


def load() -> dict[str, tuple[list[tuple[str, str, Place]], list[tuple[str, set[str]]]]]:
    """Per conversation: (id, text, place) of each utterance as the bench publishes them, and
    (question, evidence ids) of each QA item with evidence."""
    out = {}
    for conv in json.loads(DATA.read_text()):
        cid = conv["sample_id"]
        utts = [(m.id, m.content, Place(f"{t.session}/{t.execution_id}", t.turn, seq, 0,
                                        at_ms=int(t.occurred_at.timestamp() * 1000), chars=len(m.content)))
                for t in conversation_turns(conv, "t", "a") for seq, m in enumerate(t.messages)]
        out[cid] = (utts, [(qa["question"], evidence(qa)) for qa in conv["qa"] if evidence(qa)])
        for qa in conv["qa"]:
            WINDOWS[(cid, qa["question"])] = named_time.window(qa["question"], asked_at(conv))
            CATEGORY[(cid, qa["question"])] = qa["category"]
    return out


# Filled by `load`, per (conversation, question): the time it names, as it is asked; its category.
WINDOWS: dict[tuple[str, str], named_time.Window | None] = {}
CATEGORY: dict[tuple[str, str], int] = {}


def lexical_lists(data, depth: int = LEXICAL_DEPTH, config: Any = None) -> dict[str, list[dict[str, float]]]:
    """Each question's BM25 list: Edge's tokens and weights (by `config`; the history shard's by
    default), IDF over every utterance."""
    from qdrant_edge import Bm25

    bm25 = Bm25(config or bm25_config())
    docs = {cid: [bm25.embed_document(text) for _, text, _ in utts] for cid, (utts, _) in data.items()}
    df = Counter(t for ds in docs.values() for d in ds for t in set(d.indices))
    n = sum(len(ds) for ds in docs.values())
    idf = {t: math.log(1 + (n - c + 0.5) / (c + 0.5)) for t, c in df.items()}
    out = {}
    for cid, (utts, qs) in data.items():
        postings = defaultdict(list)
        for j, d in enumerate(docs[cid]):
            for t, v in zip(d.indices, d.values, strict=True):
                postings[t].append((j, v))
        lists = []
        for q, _ in qs:
            scores: dict[str, float] = defaultdict(float)
            sq = bm25.embed_query(q)
            for t, qv in zip(sq.indices, sq.values, strict=True):
                for j, v in postings.get(t, ()):
                    scores[utts[j][0]] += idf[t] * v * qv
            lists.append(dict(sorted(scores.items(), key=lambda kv: -kv[1])[:depth]))
        out[cid] = lists
    return out


def bm25s_lists(data, depth: int = 25) -> dict[str, list[dict[str, float]]]:
    """Each question's list from a plain BM25 (bm25s, English stopwords) over its conversation."""
    import bm25s

    out = {}
    for cid, (utts, qs) in data.items():
        index = bm25s.BM25()
        index.index(bm25s.tokenize([t for _, t, _ in utts], stopwords="en", show_progress=False), show_progress=False)
        lists = []
        for q, _ in qs:
            docs, scores = index.retrieve(bm25s.tokenize([q], stopwords="en", show_progress=False),
                                          k=min(depth, len(utts)), show_progress=False)
            lists.append({utts[int(j)][0]: float(v) for j, v in zip(docs[0], scores[0], strict=True)})
        out[cid] = lists
    return out


def dense_lists(data, depth: int = HYBRID_DEPTH) -> dict[str, list[dict[str, float]]]:
    out = {}
    for cid, (utts, qs) in data.items():
        sims = embedded([q for q, _ in qs]) @ embedded([text for _, text, _ in utts]).T
        out[cid] = [{utts[j][0]: float(row[j]) for j in np.argsort(-row, kind="stable")[:depth]} for row in sims]
    return out


def rrf(lexical: dict[str, float], dense: dict[str, float], k: int = 60) -> dict[str, float]:
    """Reciprocal rank fusion, as Qdrant computed it for memory search before score fusion."""
    out: dict[str, float] = defaultdict(float)
    for scores in (lexical, dense):
        for rank, key in enumerate(sorted(scores, key=lambda x: -scores[x])):
            out[key] += 1 / (k + rank + 1)
    return out


def memory_recall_at(data, lex, den, convs, fuse) -> list[float]:
    """Evidence recall@5/10/25 of each question's utterances as stand-alone records."""
    shares: dict[int, list[float]] = defaultdict(list)
    for cid in convs:
        for (_, ev), lx, dn in zip(data[cid][1], lex[cid], den[cid], strict=True):
            scores = fuse(lx, dn)
            top = sorted(scores, key=lambda k: -scores[k])
            for k in KS:
                shares[k].append(len(ev & set(top[:k])) / len(ev))
    return [round(100 * float(np.mean(shares[k])), 1) for k in KS]


def recall_at(data, lex, den, convs, weight: float, neighbour: float, time_weight: float = ranking.TIME_WEIGHT,
              only_timed: bool = False, category: int | None = None) -> list[float]:
    shares: dict[int, list[float]] = defaultdict(list)
    for cid in convs:
        utts, qs = data[cid]
        places = {i: p for i, _, p in utts}
        for (q, ev), lx, dn in zip(qs, lex[cid], den[cid], strict=True):
            w = WINDOWS[(cid, q)]
            if (only_timed and w is None) or (category is not None and CATEGORY[(cid, q)] != category):
                continue
            scores = ranking.ranked_keys(lx, dn, places, weight, neighbour, w and w.ms(), time_weight)
            top = sorted(scores, key=lambda k: (-round(scores[k], 9), -places[k].turn, -places[k].sequence))
            for k in KS:
                shares[k].append(len(ev & set(top[:k])) / len(ev))
    return [round(100 * float(np.mean(shares[k])), 1) for k in KS]


def main(argv: list[str]) -> int:
    data = load()
    lex, den = lexical_lists(data), dense_lists(data)
    if "--validation" in argv:
        w, n = ranking.LEXICAL_WEIGHT, ranking.NEIGHBOUR_WEIGHT
        print(json.dumps({"split": "validation", "weight": w, "neighbour": n, "lexical_depth": LEXICAL_DEPTH,
                          "dense_depth": HYBRID_DEPTH,
                          "recall_at_5_10_25": recall_at(data, lex, den, SPLITS["validation"], w, n)}))
        return 0
    if "--memory" in argv:
        from qdrant_edge import Bm25Config

        lx, dn = lexical_lists(data, MEMORY_DEPTH, Bm25Config()), dense_lists(data, MEMORY_DEPTH)  # the memory shard's
        for split, convs in SPLITS.items():
            fusions = [("rrf60", rrf)] + [(f"score{w}", lambda a, b, w=w: ranking.fused_keys(a, b, w))
                                          for w in ((0.5, 0.6, 0.7, 0.8) if split == "tuning" else (0.7,))]
            for name, fuse in fusions:
                print(json.dumps({"split": split, "memory": name,
                                  "recall_at_5_10_25": memory_recall_at(data, lx, dn, convs, fuse)}), flush=True)
        return 0
    if "--time" in argv:  # the time prior's weight; then, without and with it, each category
        w, n = ranking.LEXICAL_WEIGHT, ranking.NEIGHBOUR_WEIGHT
        for t in (0.0, 0.1, 0.2, 0.3, 0.5, 1.0):
            for only in (False, True):
                print(json.dumps({"split": "tuning", "time_weight": t, "only_naming_a_time": only,
                                  "recall_at_5_10_25": recall_at(data, lex, den, SPLITS["tuning"], w, n, t, only)}),
                      flush=True)
        for cat, name in CATEGORIES.items():
            for t in (0.0, ranking.TIME_WEIGHT):
                print(json.dumps({"split": "tuning", "category": name, "time_weight": t, "recall_at_5_10_25":
                                  recall_at(data, lex, den, SPLITS["tuning"], w, n, t, category=cat)}), flush=True)
        return 0
    if "--bm25" in argv:  # BM25's average length: lexical alone, hybrid, and the two weakest categories
        from qdrant_edge import Bm25Config

        w, n = ranking.LEXICAL_WEIGHT, ranking.NEIGHBOUR_WEIGHT
        print(json.dumps({"split": "tuning", "bm25s_stopwords": recall_at(data, bm25s_lists(data), den, SPLITS["tuning"],
                                                                         1.0, 0.0, 0.0)}), flush=True)
        for avg in BM25_AVG_LENS:
            lx = lexical_lists(data, config=Bm25Config(avg_len=avg))
            print(json.dumps({"split": "tuning", "bm25_avg_len": avg,
                              "lexical": recall_at(data, lx, den, SPLITS["tuning"], 1.0, 0.0, 0.0),
                              "hybrid": recall_at(data, lx, den, SPLITS["tuning"], w, n),
                              **{CATEGORIES[c]: recall_at(data, lx, den, SPLITS["tuning"], w, n, category=c)
                                 for c in (1, 3)}}), flush=True)
        return 0
    if "--depths" in argv:
        full_lex, full_den = lexical_lists(data, max(DEPTHS)[0]), dense_lists(data, max(d for _, d in DEPTHS))
        for dl, dd in DEPTHS:
            lx = {c: [dict(list(x.items())[:dl]) for x in xs] for c, xs in full_lex.items()}
            dn = {c: [dict(list(x.items())[:dd]) for x in xs] for c, xs in full_den.items()}
            print(json.dumps({"split": "tuning", "lexical_depth": dl, "dense_depth": dd, "recall_at_5_10_25":
                              recall_at(data, lx, dn, SPLITS["tuning"], ranking.LEXICAL_WEIGHT,
                                        ranking.NEIGHBOUR_WEIGHT)}), flush=True)
        return 0
    for w, n in GRID:
        print(json.dumps({"split": "tuning", "weight": w, "neighbour": n,
                          "recall_at_5_10_25": recall_at(data, lex, den, SPLITS["tuning"], w, n)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
