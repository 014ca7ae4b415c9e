"""Token estimates and the pin budget: one rule for every place that guesses a text's tokens
without its model's tokenizer (usage records, the pinned section's budget)."""

from __future__ import annotations

from typing import Protocol

CHARS_PER_TOKEN = 4


class _Pinnable(Protocol):
    summary: str
    id: str


def estimate_tokens(text: str) -> int:
    """About how many tokens `text` is for an embedder or a model: at least one."""
    return len(text) // CHARS_PER_TOKEN + 1


def pin_line_chars(r: _Pinnable) -> int:
    # One line per pin: the summary and the record id.
    return len(r.summary) + len(r.id) + 3


def pin_budget_chars(max_tokens: int) -> int:
    """The characters the pinned lines of one agent may take together (`memory.pinned.max_tokens`)."""
    return max_tokens * CHARS_PER_TOKEN
