"""Rendering recalled memory costs what is shown, not what is stored: a field is cut before
it is cleaned, and plain ASCII text skips the Unicode passes."""

from __future__ import annotations

import unicodedata
from datetime import UTC, datetime
from types import SimpleNamespace

from events.record import MemoryRecord, Scope
from events.rules import recall_render
from events.rules.recall_render import CONTENT_CHARS, render

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def rec(content: str) -> MemoryRecord:
    return MemoryRecord(id="r1", version=1, created=NOW, modified=NOW, tenant="t", agent="a", scope=Scope.AGENT,
                        kind="fact", summary="notes", content=content)


def test_a_long_content_is_cut_before_it_is_cleaned_and_still_marked_cut(monkeypatch):
    seen = []
    monkeypatch.setattr(recall_render, "unicodedata", SimpleNamespace(
        normalize=lambda form, t: seen.append(len(t)) or unicodedata.normalize(form, t), category=unicodedata.category))
    content = "caf\u00e9 line\n" * 1400  # 15 KB, not plain ASCII
    out = render([], [rec(content)])
    assert max(seen) <= CONTENT_CHARS * recall_render.CUT_MARGIN
    assert "…" in out and len(out) < 2 * CONTENT_CHARS
    # Cut text that cleaning shrinks below the display length is still marked as cut.
    out = render([], [rec("word\u200b" * 1000)])
    assert "…" in out


def test_plain_ascii_skips_the_unicode_passes_and_renders_the_same(monkeypatch):
    plain = "Deploys on Tuesdays.\n# not a heading\n\n  indented   line  \nlast"
    before = render([], [rec(plain)])
    monkeypatch.setattr(recall_render, "unicodedata", None)  # any use would fail
    assert render([], [rec(plain)]) == before
    assert "  \\# not a heading\n" in before and "  indented   line\n" in before
