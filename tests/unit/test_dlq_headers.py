"""The replay headers of `memlane dlq replay` (workers/runtime/dlq.py): which group a replay is for,
where it first was, what a repeat keeps, and the topic names an operator may type."""

from __future__ import annotations

import pytest

from settings import Settings
from workers.runtime.dlq import (
    REPLAY_COUNT,
    REPLAY_FOR,
    REPLAY_OF,
    REPLAY_ORIGIN,
    dlq_name,
    kept_on_repeat,
    replay_group,
    replay_origin,
)


def test_a_replay_names_its_group_and_first_place():
    h = [("source_topic", b"p.memlane.turns"), (REPLAY_FOR, b"memlane.p.extraction"),
         (REPLAY_ORIGIN, b"p.memlane.turns/3/1207")]
    assert replay_group(h) == "memlane.p.extraction" and replay_origin(h) == (3, 1207)
    assert replay_group(None) is None and replay_origin([]) is None
    assert replay_origin([(REPLAY_ORIGIN, b"garbage")]) is None


def test_a_repeat_keeps_the_replay_headers_only():
    h = [("error", b"boom"), (REPLAY_OF, b"t.dlq@0:4"), (REPLAY_COUNT, b"2"), ("attempt", b"1")]
    assert kept_on_repeat(h) == ((REPLAY_OF, b"t.dlq@0:4"), (REPLAY_COUNT, b"2"))
    assert kept_on_repeat(None) == ()


def test_topic_names_an_operator_types():
    s = Settings(topic_prefix="run1.")
    for spec in ("memlane.turns", "memlane.turns.dlq", "run1.memlane.turns.dlq"):
        assert dlq_name(spec, s) == "memlane.turns.dlq"
    with pytest.raises(ValueError, match="no dead-letter topic"):
        dlq_name("memlane.nope", s)
