"""The hybrid ranking rules of session history (projections.qdrant.ranking), and the Edge shard
ranking by them."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from projections.qdrant import ranking
from projections.qdrant.ranking import Place, fused, lifted, neighbours, ranked_keys, scaled

M = ranking.MISSED


def arr(*xs: float) -> np.ndarray:
    return np.array(xs, dtype=float)


def test_each_list_is_scaled_to_its_own_range():
    assert scaled(arr(12.0, 7.0, 2.0)).tolist() == [1.0, 0.5, 0.0]
    # A cosine range and the same order at another scale give the same scaled scores.
    assert scaled(arr(0.31, 0.30, 0.29)) == pytest.approx(scaled(arr(0.9, 0.6, 0.3)))
    assert scaled(arr(0.5, 0.5)).tolist() == [1.0, 1.0] and scaled(arr()).tolist() == []
    # A candidate the list missed gets 0, and does not widen its range.
    assert scaled(arr(12.0, M, 2.0, M)).tolist() == [1.0, 0.0, 0.0, 0.0]
    assert scaled(arr(M, 3.0)).tolist() == [0.0, 1.0]


def test_fusion_weighs_the_lists_and_a_list_that_missed_a_candidate_gives_it_nothing():
    # Candidates: both, lex, low, den, far.
    lex = arr(10.0, 8.0, 0.0, M, M)
    den = arr(0.8, M, M, 0.9, 0.1)
    both, lexo, low, deno, far = fused(lex, den, weight=0.7)
    assert lexo == pytest.approx(0.7 * 0.8) and deno == pytest.approx(0.3 * 1.0)
    assert both == pytest.approx(0.7 + 0.3 * 0.875) and low == far == 0.0
    # Score-aware: a candidate far ahead in one list beats one just ahead in both (RRF would not).
    x, y, _ = fused(arr(10.0, 9.9, 0.0), arr(0.49, 0.50, 0.1), weight=0.5)
    assert x < y
    x, y, _ = fused(arr(10.0, 1.0, 0.0), arr(0.49, 0.50, 0.1), weight=0.5)
    assert x > y


def pairs(places: dict[str, Place]) -> set[frozenset[str]]:
    keys = list(places)
    a, b = neighbours(ranking.rows_of(list(places.values())))
    return {frozenset((keys[i], keys[j])) for i, j in zip(a, b, strict=True)}


def test_neighbours_are_the_nearest_candidates_of_the_same_conversation_at_most_a_turn_apart():
    places = {
        "far": Place("s/c1", 9, 0, 0),  # four turns on: no neighbour of b
        "b": Place("s/c1", 5, 1, 0),
        "q": Place("s/c1", 4, 1, 0),  # a question at the end of turn 4
        "other": Place("s/c2", 5, 0, 0),  # another conversation
        "a": Place("s/c1", 5, 0, 0),  # its answer opens turn 5
    }
    assert pairs(places) == {frozenset("qa"), frozenset("ab")}
    # Parts of one long message are neighbours, in order.
    parts = {"p2": Place("s/c", 1, 0, 2), "p0": Place("s/c", 1, 0, 0), "p1": Place("s/c", 1, 0, 1)}
    assert pairs(parts) == {frozenset(("p0", "p1")), frozenset(("p1", "p2"))}


def test_a_candidate_is_lifted_by_a_share_of_its_neighbours_scores_before_lifting():
    # q and a are neighbours, as are a and x; y stands alone.
    got = lifted(arr(1.0, 0.2, 0.5, 0.3), (np.array([0, 1]), np.array([1, 2])), weight=0.4)
    assert got == pytest.approx([1.0 + 0.4 * 0.2, 0.2 + 0.4 * 1.0 + 0.4 * 0.5, 0.5 + 0.4 * 0.2, 0.3])


def test_ties_go_to_newer_events_then_the_earlier_part_then_the_tiebreak():
    rows = ranking.rows_of([Place("s/c", 3, 0, 0), Place("s/c", 3, 1, 1), Place("s/c", 3, 1, 0),
                            Place("s/d", 3, 1, 0), Place("s/c", 1, 0, 0)])
    scores = arr(0.5, 0.5, 0.5, 0.5, 0.9)
    assert ranking.order(scores, rows, np.array([0, 0, 2, 1, 0])).tolist() == [4, 3, 2, 1, 0]
    # Scores equal to 9 decimals are ties.
    assert ranking.order(arr(0.5 + 1e-12, 0.5), rows[:2], np.array([0, 1])).tolist() == [1, 0]


def test_an_answer_that_shares_no_word_with_the_question_rises_above_a_lone_weak_match():
    # "When is standup?" matches the question in the chat word for word; the answer after it
    # ("9:30 on weekdays") shares no word and is found only as the question's neighbour.
    lex = {"question": 9.0, "weak": 3.0, "noise": 0.5}
    den = {"question": 0.7, "weak": 0.5, "answer": 0.45, "noise": 0.4}
    places = {"question": Place("s/c", 3, 0, 0), "answer": Place("s/c", 3, 1, 0),
              "weak": Place("s/c", 12, 0, 0), "noise": Place("s/c", 20, 1, 0)}
    order = sorted(ranked_keys(lex, den, places).items(), key=lambda kv: -kv[1])
    assert [k for k, _ in order][:2] == ["question", "answer"]
    without = sorted(ranked_keys(lex, den, places, neighbour=0.0).items(), key=lambda kv: -kv[1])
    assert [k for k, _ in without][:2] == ["question", "weak"]


def test_the_edge_shard_ranks_hybrid_search_by_these_rules(tmp_path):
    from events.rules.history import HistoryFilter, KeptEvent
    from projections.qdrant.history_index import HistoryIndex, event_parts

    index = HistoryIndex(tmp_path / "history", dim=4)
    # (text, turn, sequence, dense axis): e1 answers e0 without a word of the query, e4 is far off.
    events = [("when is the team standup meeting", 1, 0, 0), ("every weekday at half past nine", 1, 1, 1),
              ("the deploy freeze is friday", 2, 0, 2), ("lunch is at noon", 2, 1, 3),
              ("standup notes are in the wiki somewhere", 9, 0, 3)]
    rows = []
    for i, (text, turn, seq, axis) in enumerate(events):
        e = KeptEvent(id=f"e{i}", tenant="t", agent="a", session="s", turn=turn, attempt=1, execution_id="x",
                      sequence=seq, role="user", kind="message", text=text, preview=False,
                      occurred_ms=1_700_000_000_000 + i)
        [(pid, payload)] = event_parts(e)
        rows.append((pid, payload, np.eye(4)[axis].tolist()))
    index.upsert(rows)
    f = HistoryFilter("t", "a", "s", False, ("message",))
    query = [0.0, 0.0, 1.0, 0.0]  # the deploy freeze's axis
    hits = index.search(f, query, "standup", 5)
    got = [h.payload["event_id"] for h in hits]
    expected = _expected(index, f, query, "standup")
    assert {h.payload["event_id"]: h.score for h in hits} == pytest.approx(expected)
    assert got == sorted(expected, key=lambda k: -expected[k])
    # The answer, found by neither list, comes second: lifted by its question and the dense hit.
    assert got[:3] == ["e0", "e1", "e2"], got
    # Pages of the same search continue one order.
    assert [h.payload["event_id"] for h in index.search(f, query, "standup", 2, 2)] == got[2:4]
    # A candidate the caller may not see (said before the agent joined) is left out before
    # ranking: it lifts no neighbour, and the others score as if it were never found.
    asked: list = []

    def visible(places):
        asked.append(sorted((p.session, p.turn, p.sequence) for p in places))
        return lambda p: (p.turn, p.sequence) != (1, 0)

    hidden = {h.payload["event_id"]: h.score for h in index.search(f, query, "standup", 5, visible=visible)}
    assert "e0" not in hidden and hidden["e1"] < {h.payload["event_id"]: h.score for h in hits}["e1"]
    assert hidden == pytest.approx({k: v for k, v in _expected(index, f, query, "standup", drop="e0").items()})
    assert asked and ("s", 1, 0) in asked[0]
    # The event loop's search never waits: while a write (another thread) holds the shard, None.
    held, release = threading.Event(), threading.Event()

    def write():
        with index._lock:
            held.set()
            release.wait(10)

    writer = threading.Thread(target=write)
    writer.start()
    held.wait(10)
    assert index.search_now(f, query, "standup", 5) is None
    release.set()
    writer.join()
    assert [h.payload["event_id"] for h in index.search_now(f, query, "standup", 5)] == got
    index.close()


def _expected(index, f, dense, text, drop=None):
    """The rules applied by hand to the engine's two lists."""
    from qdrant_edge import Query, QueryRequest

    from projections.qdrant.history_index import place

    flt = index._filter(f)
    lex = index.shard.query(QueryRequest(limit=200, query=Query.Nearest(index.bm25.embed_query(text), using="bm25"),
                                         filter=flt, with_payload=True))
    den = index.shard.query(QueryRequest(limit=200, query=Query.Nearest(dense, using="dense"), filter=flt,
                                         with_payload=True))
    stored = {str(p.id): p.payload for p in (*lex, *den) if p.payload["event_id"] != drop}
    got = ranking.ranked_keys({str(p.id): p.score for p in lex if str(p.id) in stored},
                         {str(p.id): p.score for p in den if str(p.id) in stored},
                         {k: place(v) for k, v in stored.items()})
    return {stored[k]["event_id"]: v for k, v in got.items()}


def test_the_place_store_reads_each_place_once_and_starts_again_past_its_size():
    from projections.qdrant.history_index import Places

    store = {k: Place("s/c", k, 0, 0) for k in range(10)}
    reads: list[list[int]] = []

    def read(keys):
        reads.append(keys)
        return {k: store[k] for k in keys if k in store}

    places = Places(kept=4)
    keys, rows, got = places.of([3, 1, 99], read)  # 99: gone since the query
    assert keys == [3, 1] and rows[:, 1].tolist() == [3, 1] and got == [store[3], store[1]]
    assert places.of([1, 3], read)[0] == [1, 3] and reads == [[3, 1, 99]]  # known: not read again
    places.of([4, 5, 6], read)  # five known: past its size
    keys, rows, _ = places.of([1, 7], read)  # the store started again: both read back
    assert keys == [1, 7] and rows[:, 1].tolist() == [1, 7] and reads[-1] == [1, 7]


def test_a_long_message_is_one_candidate_its_best_part():
    # A 6,000-character message in three parts, each matching a little, and a short message.
    lex = {"long1": 5.0, "long2": 9.0, "long3": 4.0, "short": 6.0}
    den = {"long1": 0.5, "long2": 0.6, "long3": 0.5, "short": 0.55}
    places = {f"long{p}": Place("s/c", 4, 1, p, chars=6000) for p in (1, 2, 3)} | {
        "short": Place("s/c", 9, 0, 0, chars=80)}
    got = ranked_keys(lex, den, places)
    assert sorted(got) == ["long2", "short"]  # the part that answers stands for its message
    assert max(got, key=got.get) == "long2"


def test_a_long_message_takes_a_smaller_share_of_its_neighbours():
    # The same pair of neighbours, once short and once 2,400 characters long: the long one is
    # lifted by a quarter as much (SHORT_CHARS / 2,400).
    scores, rows = arr(0.5, 1.0), None
    for chars, share in ((200, 1.0), (2400, ranking.SHORT_CHARS / 2400)):
        rows = ranking.rows_of([Place("s/c", 3, 0, 0, chars=chars), Place("s/c", 3, 1, 0, chars=100)])
        out = lifted(scores, neighbours(rows), 0.4, ranking.shares(rows))
        assert out[0] == pytest.approx(0.5 + 0.4 * share * 1.0)
        assert out[1] == pytest.approx(1.0 + 0.4 * 0.5)  # the short one's lift is whole
    assert ranking.shares(ranking.rows_of([Place("s/c", 1, 0, 0)]))[0] == 1.0  # length unknown: as before


def test_ranking_shrinks_the_lift_of_a_long_message():
    lex, den = {"q": 9.0, "x": 1.0, "floor": 0.0}, {"q": 0.7, "x": 0.5, "floor": 0.1}

    def score_of_x(chars: int) -> float:
        places = {"q": Place("s/c", 3, 0, 0, chars=50), "x": Place("s/c", 3, 1, 0, chars=chars),
                  "floor": Place("s/c", 40, 0, 0, chars=50)}
        return ranked_keys(lex, den, places)["x"]

    assert score_of_x(2400) < score_of_x(300) == score_of_x(600)


def test_what_was_said_inside_the_named_window_is_lifted_and_nothing_else():
    day = 86_400_000
    rows = ranking.rows_of([Place("s/c", t, 0, 0, at_ms=t * day) for t in (1, 2, 3)])
    scores = arr(0.9, 0.5, 0.4)
    assert ranking.timed(scores, rows[:, 5], None) is scores  # no window: unchanged
    # Since inclusive, until exclusive: day 2 only.
    assert ranking.timed(scores, rows[:, 5], (2 * day, 3 * day), 0.5).tolist() == pytest.approx([0.9, 1.0, 0.4])


def test_a_question_naming_a_time_ranks_that_time_first_but_a_strong_match_outside_it_still_counts():
    day = 86_400_000
    lex = {"old": 9.0, "named": 6.0, "other": 5.9, "floor": 0.0}
    den = {"old": 0.8, "named": 0.6, "other": 0.6, "floor": 0.1}
    places = {k: Place("s/c", t, 0, 0, at_ms=at * day) for k, t, at in
              (("old", 1, 1), ("named", 10, 20), ("other", 20, 30), ("floor", 30, 40))}
    plain = ranked_keys(lex, den, places)
    timed = ranked_keys(lex, den, places, window=(20 * day, 21 * day))
    assert max(plain, key=plain.get) == "old" and max(timed, key=timed.get) == "named"
    assert timed["other"] == plain["other"] and timed["named"] == pytest.approx(plain["named"] + ranking.TIME_WEIGHT)
    # A prior, not a filter: the strong match outside the window stays ahead of the weak one inside it.
    weak = ranked_keys(lex | {"named": 0.5}, den | {"named": 0.15}, places, window=(20 * day, 21 * day))
    assert weak["old"] > weak["named"]
