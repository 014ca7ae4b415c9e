"""The LongMemEval bench's measures (tests.bench.longmemeval.scores) on a made-up question."""

from __future__ import annotations

from tests.bench.longmemeval import scores

ITEM = {
    "haystack_session_ids": ["a", "b", "c", "d", "e", "f", "g"],
    "haystack_sessions": [[{"content": "x", "has_answer": True}], [{"content": "x"}], [{"content": "x"}],
                          [{"content": "x"}], [{"content": "x"}], [{"content": "x", "has_answer": True}],
                          [{"content": "x"}]],
    "answer_session_ids": ["a", "f", "g"],  # g holds no marked message
}


def test_session_recall_reads_the_first_five_sessions_the_ranking_names():
    # Six messages from five sessions: "f" is the sixth message but among the first five sessions.
    ranked = ["a:0", "a:1", "b:0", "c:0", "d:0", "f:0", "g:0"]
    got = scores(ranked, ITEM)
    assert got["evidence_session_all@5"] == 1.0
    assert got["message_session_all@5"] == 0.0  # the top five messages alone miss "f"
    assert got["session_all@5"] == 0.0  # "g" is the sixth session
    assert got["turn@5"] == 0.5


def test_every_answer_session_among_the_first_five_counts():
    got = scores(["a:0", "f:0", "g:0", "b:0", "c:0", "d:0"], ITEM)
    assert got["session_all@5"] == got["evidence_session_all@5"] == got["message_session_all@5"] == 1.0
