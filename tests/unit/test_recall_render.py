"""The recalled-memory block (pure)."""

from datetime import UTC, datetime

from events.record import MemoryRecord, Scope
from services.recall_render import BLOCK_CHARS, render, within_block

NOW = datetime(2026, 3, 1, tzinfo=UTC)


def rec(i: int, summary: str, content: str = "", pinned: bool = False) -> MemoryRecord:
    return MemoryRecord(id=f"rec-{i}", version=1, created=NOW, modified=NOW, tenant="t", agent="a", scope=Scope.AGENT,
                        kind="fact", summary=summary, content=content, pinned=pinned)


def test_records_that_do_not_fit_the_block_are_left_out_whole():
    # Seed 004: the block is capped at 8,000 characters; facts that do not fit are skipped whole.
    big = [rec(i, f"fact {i} " + "x" * 300, content="y" * 2000) for i in range(10)]
    small = rec(99, "a short fact")
    kept, _, _ = within_block([], [*big, small])
    text = render([], kept)
    assert len(text) <= BLOCK_CHARS
    assert 0 < len(kept) < len(big) + 1 and small in kept  # a smaller record after a skipped one still fits
    assert all(f"(id: {r.id}, v1)" in text for r in kept)
    skipped = [r for r in big if r not in kept]
    assert skipped and len(render([], [*kept, skipped[0]])) > BLOCK_CHARS


def test_pins_are_never_dropped_for_the_block_cap():
    pins = [rec(i, "p" * 500, pinned=True) for i in range(20)]  # ~10,000 characters of pins
    assert within_block(pins, [rec(99, "a fact")]) == ([], [], [])
    assert all(p.id in render(pins, []) for p in pins)


def test_episodes_and_procedures_have_their_own_sections_after_the_records():
    fact, episode, procedure = rec(1, "a fact"), rec(2, "an episode"), rec(3, "a procedure", content="1. one\n2. two")
    episode = episode.model_copy(update={"kind": "episode"})
    procedure = procedure.model_copy(update={"kind": "procedure"})
    kept = within_block([], [fact], [("style", "Tabs")], [episode], [procedure])
    assert kept == ([fact], [episode], [procedure])
    text = render([], *kept, blocks=[("style", "Tabs")])
    order = [text.index(h) for h in ("## Blocks", "## Records", "## Episodes", "## Procedures")]
    assert order == sorted(order) and "  1. one\n  2. two\n" in text
