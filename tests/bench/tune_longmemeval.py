"""History ranking on LongMemEval_S, in process: `python -m tests.bench.tune_longmemeval [--validation]`.

Ranks each question's haystack as the history shard would (parts of at most `PART_CHARS`, Edge's
BM25 with IDF over every question's parts as one shard holds them, MiniLM vectors cached under
the system's temp directory, `projections.qdrant.ranking`), beside a plain BM25 over whole
messages (bm25s, English stopwords). Prints turn recall@5/10/25 and session recall_all@5 for
the ranking's weights on the tuning half (each question asked at its `question_date`);
`--time`, the time prior's weights; `--bm25`, BM25's average length; `--validation` the chosen one on the validation half, which
nothing here tunes on. The figures that count are `make bench ONLY=history`'s, through Kafka
and HTTP.
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from events.rules.history import split_parts
from projections.qdrant import ranking
from projections.qdrant.history_index import HYBRID_DEPTH, LEXICAL_DEPTH, bm25_config
from projections.qdrant.ranking import Place
from tests.bench import longmemeval as lme
from tests.bench.common import embedded

LIMIT = 25  # the parts one search returns, as the bench asks for them
GRID = [(w, n) for w in (0.5, 0.6, 0.7, 0.8) for n in (0.0, 0.2, 0.4, 0.5)]
TIME_GRID = (0.0, 0.1, 0.2, 0.3, 0.5, 1.0)


class Question:
    def __init__(self, item: dict[str, Any]) -> None:
        self.item = item
        self.parts: list[tuple[str, str, Place]] = []  # (message id, text, place)
        self.texts: dict[str, str] = {}
        self.window = lme.named_window(item)
        for turn in lme.turns(item, "t", "a"):
            at_ms = int(turn.occurred_at.timestamp() * 1000)
            for seq, m in enumerate(turn.messages):
                self.texts[m.id] = m.content
                for p, t in enumerate(split_parts(m.content)):
                    self.parts.append((m.id, t, Place(lme.session_of(m.id), turn.turn, seq, p + 1,
                                                      at_ms=at_ms, chars=len(m.content))))


def lexical(questions: list[Question], depth: int = LEXICAL_DEPTH, config: Any = None) -> list[dict[int, float]]:
    """Each question's BM25 list over its parts (part index -> score), by `config` (the history
    shard's by default)."""
    from qdrant_edge import Bm25

    bm25 = Bm25(config or bm25_config())
    docs = [[bm25.embed_document(t) for _, t, _ in q.parts] for q in questions]
    df = Counter(t for ds in docs for d in ds for t in set(d.indices))
    n = sum(len(ds) for ds in docs)
    idf = {t: math.log(1 + (n - c + 0.5) / (c + 0.5)) for t, c in df.items()}
    out = []
    for q, ds in zip(questions, docs, strict=True):
        postings = defaultdict(list)
        for j, d in enumerate(ds):
            for t, v in zip(d.indices, d.values, strict=True):
                postings[t].append((j, v))
        scores: dict[int, float] = defaultdict(float)
        sq = bm25.embed_query(q.item["question"])
        for t, qv in zip(sq.indices, sq.values, strict=True):
            for j, v in postings.get(t, ()):
                scores[j] += idf[t] * v * qv
        out.append(dict(sorted(scores.items(), key=lambda kv: -kv[1])[:depth]))
    return out


def dense(questions: list[Question], depth: int = HYBRID_DEPTH,
          text: Callable[[Question, int], str] = lambda q, j: q.parts[j][1]) -> list[dict[int, float]]:
    out = []
    for q in questions:
        row = embedded([q.item["question"]])[0] @ embedded([text(q, j) for j in range(len(q.parts))]).T
        out.append({int(j): float(row[j]) for j in np.argsort(-row, kind="stable")[:depth]})
    return out


def bm25s_ranked(q: Question) -> list[str]:
    import bm25s

    ids = list(q.texts)
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize([q.texts[i] for i in ids], stopwords="en", show_progress=False), show_progress=False)
    docs, _ = retriever.retrieve(bm25s.tokenize([q.item["question"]], stopwords="en", show_progress=False),
                                 k=min(LIMIT, len(ids)), show_progress=False)
    return [ids[int(j)] for j in docs[0]]


def as_messages(q: Question, scores: dict[int, float]) -> list[str]:
    """The bench's reading of a search: the top `LIMIT` parts, their messages in order."""
    top = sorted(scores, key=lambda j: (-round(scores[j], 9), -q.parts[j][2].turn, -q.parts[j][2].sequence,
                                        q.parts[j][2].part))[:LIMIT]
    return list(dict.fromkeys(q.parts[j][0] for j in top))


def report(name: str, runs: list[tuple[list[str], dict[str, Any]]]) -> None:
    got: dict[str, list[float]] = defaultdict(list)
    for ranked, item in runs:
        for k, v in lme.scores(ranked, item).items():
            got[k].append(v)
    print(json.dumps({"variant": name, **{k: round(100 * float(np.nanmean(v)), 1) for k, v in got.items()
                                          if k in lme.REPORTED}}), flush=True)


def main(argv: list[str]) -> int:
    half = "validation" if "--validation" in argv else "tuning"
    everything = [Question(x) for x in lme.load()]
    lex_all = lexical(everything)  # IDF over every question, as one shard holds them
    chosen = {q.item["question_id"] for q in everything if q.item in lme.split([x.item for x in everything])[half]}
    picked = [(q, lx) for q, lx in zip(everything, lex_all, strict=True) if q.item["question_id"] in chosen]
    qs = [q for q, _ in picked]
    lex = [lx for _, lx in picked]
    den = dense(qs)
    if "--bm25" in argv:  # BM25's average length: lexical alone and hybrid, the weights as chosen
        from qdrant_edge import Bm25Config

        from tests.bench.tune_history import BM25_AVG_LENS

        for avg in BM25_AVG_LENS:
            by_id = {q.item["question_id"]: lx for q, lx in zip(everything, lexical(everything, config=Bm25Config(
                avg_len=avg)), strict=True)}
            report(f"lexical avg_len {avg}", [(as_messages(q, by_id[q.item["question_id"]]), q.item) for q in qs])
            report(f"hybrid avg_len {avg}", [(as_messages(q, ranking.ranked_keys(
                by_id[q.item["question_id"]], dn, {j: p[2] for j, p in enumerate(q.parts)}, window=q.window)), q.item)
                for q, dn in zip(qs, den, strict=True)])
        return 0
    report("bm25s_stopwords", [(bm25s_ranked(q), q.item) for q in qs])
    report("lexical", [(as_messages(q, lx), q.item) for q, lx in zip(qs, lex, strict=True)])
    report("vector", [(as_messages(q, dn), q.item) for q, dn in zip(qs, den, strict=True)])
    grid = [(ranking.LEXICAL_WEIGHT, ranking.NEIGHBOUR_WEIGHT)] if half == "validation" else GRID
    if "--time" in argv:
        w, n = ranking.LEXICAL_WEIGHT, ranking.NEIGHBOUR_WEIGHT
        grid = [(w, n, t) for t in TIME_GRID]
    else:
        grid = [(w, n, ranking.TIME_WEIGHT) for w, n in grid]
    for w, n, t in grid:
        runs, timed = [], []
        for q, lx, dn in zip(qs, lex, den, strict=True):
            places = {j: q.parts[j][2] for j in range(len(q.parts))}
            runs.append((as_messages(q, ranking.ranked_keys(lx, dn, places, w, n, q.window, t)), q.item))
            if q.window is not None:
                timed.append(runs[-1])
        report(f"hybrid w{w} n{n} t{t}", runs)
        report(f"hybrid w{w} n{n} t{t}, the {len(timed)} questions naming a time", timed)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
