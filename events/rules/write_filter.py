"""The write-time filter: what no agent's or model's write may store.

It runs on every path an agent or a model writes through: extraction candidates,
consolidation's episodes, HTTP and MCP writes (`MemoryService.add`, `curate`), and
add_memory tool calls in turns. Only an operator's own write bypasses it.

Pure functions. A candidate is refused when its text carries PII, a secret or a prompt
injection, or when it is not a memory at all but a transcript or a tool dump. The filter
is fixed: it is not an organisation's guardrail policy, and it errs toward refusing,
because a refused fact can be said again while a stored secret has already leaked.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Refusal:
    reason: str  # pii | secret | prompt_injection | transcript | tool_dump
    detail: str  # which rule matched; never the matched text


EMAIL = re.compile(r"\b[A-Za-z0-9._%+\-]+@[A-Za-z0-9.\-]+\.[A-Za-z]{2,}\b")
# International or North American numbers with separators; bare digit runs are left to the
# card check, so order numbers and years do not read as phones.
PHONE = re.compile(r"(?<![\w+])(?<!\d[\s.\-])(?:\+\d{1,3}[\s.\-]?)?(?:\(\d{2,4}\)[\s.\-]?|\d{2,4}[\s.\-])\d{3,4}[\s.\-]\d{3,4}(?![\s.\-]?\d)(?!\w)")
CARD = re.compile(r"(?<!\d)(?:\d[ \-]?){12,18}\d(?!\d)")
SSN = re.compile(r"\b\d{3}-\d{2}-\d{4}\b")
IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?:\s?[A-Z0-9]{4}){3,7}(?:\s?[A-Z0-9]{1,3})?\b")

SECRETS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("private key", re.compile(r"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----")),
    ("api key (sk-)", re.compile(r"\bsk-(?:proj-|live-|test-)?[A-Za-z0-9_\-]{16,}")),
    ("aws access key", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("github token", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}\b")),
    ("slack token", re.compile(r"\bxox[abprs]-[A-Za-z0-9\-]{10,}")),
    ("google api key", re.compile(r"\bAIza[0-9A-Za-z_\-]{35}\b")),
    ("jwt", re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}")),
    ("bearer token", re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._\-]{16,}")),
    (
        "credential assignment",
        re.compile(
            r"(?i)\b(?:password|passwd|pwd|passphrase|secret|api[_\- ]?key|access[_\- ]?token|auth[_\- ]?token|token)"
            r"\s*(?:is|=|:)\s*['\"]?[^\s'\"]{4,}"
        ),
    ),
)

INJECTION: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("ignore instructions", re.compile(r"(?i)\b(?:ignore|disregard|forget)\b.{0,40}\b(?:previous|prior|above|all|earlier|system)\b.{0,20}\b(?:instructions?|prompts?|rules?|messages?)")),
    ("role override", re.compile(r"(?i)\byou are now\b|\bfrom now on,? you (?:are|will|must)\b|\bact as (?:an? )?(?:unrestricted|jailbroken|dan)\b")),
    ("system prompt", re.compile(r"(?i)\b(?:reveal|print|show|repeat)\b.{0,30}\bsystem prompt\b|\bnew (?:system )?instructions?:")),
    ("chat markup", re.compile(r"(?i)<\|?(?:im_start|im_end|system|endoftext)\|?>|\[/?(?:INST|SYS)\]")),
    ("always obey", re.compile(r"(?i)\balways (?:obey|comply with|follow) (?:the )?(?:user|these|this)\b.{0,40}\bwithout\b")),
)

SPEAKER_LINE = re.compile(r"(?im)^\s*(?:user|assistant|system|human|ai|tool|bot|agent)\s*:")
TOOL_DUMP_HINTS = re.compile(r"(?i)\"(?:tool_call_id|tool_calls|function_call|arguments|stdout|stderr|exit_code|traceback)\"")
STACK_TRACE = re.compile(r"Traceback \(most recent call last\)|^\s+at [\w.$]+\(.*\)$", re.M)


def _luhn(digits: str) -> bool:
    total, parity = 0, len(digits) % 2
    for i, ch in enumerate(digits):
        d = int(ch)
        if i % 2 == parity:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


# Cheap tests that rule a pattern group out before its regexes run (most writes hold none
# of them). Each is a necessary condition of every pattern of its group, on ASCII text only:
# there `lower()` is exactly what the patterns' case-insensitivity means and `\d` is 0-9.
# (Why not one alternation per group: docs/decisions/0011-write-filter-pre-checks.md.)
_SECRET_HINTS = ("private key", "sk-", "akia", "asia", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "xox", "aiza", "eyj",
                 "bearer", "pass", "pwd", "secret", "token")
_INJECTION_HINTS = ("ignore", "disregard", "forget", "you are now", "from now on", "act as", "system", "instruction",
                    "im_start", "im_end", "endoftext", "inst]", "sys]", "always")


def _no_secret(text: str) -> bool:
    if not text.isascii():
        return False
    low = text.lower()
    return not any(h in low for h in _SECRET_HINTS) and not ("api" in low and "key" in low)


def _no_injection(text: str) -> bool:
    if not text.isascii():
        return False
    low = text.lower()
    return not any(h in low for h in _INJECTION_HINTS)


def _digits(text: str) -> int:
    return sum(map(text.count, "0123456789"))


def find_pii(text: str) -> str | None:
    if text.isascii() and "@" not in text and _digits(text) < 8:
        # A phone, card or national id number has 8 digits or more: only an IBAN can be here.
        return "bank account number (IBAN)" if IBAN.search(text) else None
    if EMAIL.search(text):
        return "email address"
    if SSN.search(text):
        return "national id number"
    for m in CARD.finditer(text):
        digits = re.sub(r"\D", "", m.group())
        if 13 <= len(digits) <= 19 and _luhn(digits):
            return "payment card number"
    if PHONE.search(text):
        return "phone number"
    if IBAN.search(text):
        return "bank account number (IBAN)"
    return None


def find_secret(text: str) -> str | None:
    if _no_secret(text):
        return None
    for name, pattern in SECRETS:
        if pattern.search(text):
            return name
    return None


def find_injection(text: str) -> str | None:
    if _no_injection(text):
        return None
    for name, pattern in INJECTION:
        if pattern.search(text):
            return name
    return None


def _looks_like_json_dump(text: str) -> bool:
    s = text.strip()
    if not s or s[0] not in "[{" or len(s) < 80:
        return False
    try:
        json.loads(s)
    except ValueError:
        return False
    return True


def looks_like_transcript(text: str) -> str | None:
    if len(SPEAKER_LINE.findall(text)) >= 2:
        return "speaker-labelled lines"
    return None


def looks_like_tool_dump(text: str) -> str | None:
    return _tool_fields(text) or _tool_shape(text)


def _tool_fields(text: str) -> str | None:
    if TOOL_DUMP_HINTS.search(text):
        return "tool call fields"
    if STACK_TRACE.search(text):
        return "stack trace"
    return None


def _tool_shape(text: str) -> str | None:
    if _looks_like_json_dump(text):
        return "raw JSON document"
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) >= 8:
        symbolic = sum(1 for ln in lines if sum(not c.isalnum() and not c.isspace() for c in ln) > len(ln) * 0.3)
        if symbolic >= len(lines) * 0.5:
            return "log or table output"
    return None


def _check_text(text: str) -> Refusal | None:
    """The first rule one text breaks. The rules about a whole text's shape (a transcript, a
    JSON or log dump) only look at a text long or multi-line enough to have that shape."""
    for reason, rule in (
        ("secret", find_secret),  # before PII: a key inside an email-like string is a secret first
        ("pii", find_pii),
        ("prompt_injection", find_injection),
    ):
        if detail := rule(text):
            return Refusal(reason, detail)
    shaped = "\n" in text or len(text) >= 80
    if shaped and (detail := looks_like_transcript(text)):
        return Refusal("transcript", detail)
    if detail := _tool_fields(text):
        return Refusal("tool_dump", detail)
    if shaped and (detail := _tool_shape(text)):
        return Refusal("tool_dump", detail)
    return None


def _check_field(values: list[str]) -> Refusal | None:
    """The first rule one of a field's values breaks, each value scanned on its own: joined,
    two harmless values could make a match across them (`\\s` spans any separator)."""
    for v in values:
        if hit := _check_text(v):
            return hit
    return None


@dataclass(frozen=True)
class FieldRefusal:
    """A refused write: which field broke which rule. Label and metadata keys are never named,
    since a key can be the secret itself."""

    field: str  # summary | content | kind | key | labels | metadata | line | label
    refusal: Refusal

    def message(self) -> str:
        r = self.refusal
        return (f"{self.field}: refused by the write-time filter ({r.reason}: {r.detail}); memory never keeps "
                "secrets, personal data, instructions aimed at the agent, transcripts or tool dumps. "
                f"Take it out of {self.field} and send the write again")


def _scalars(value: object) -> list[str]:
    """Every key and scalar of a JSON value as text, walked without recursion so that a
    deeply nested value cannot exhaust the stack. Numbers count: a card number can be one."""
    out: list[str] = []
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, dict):
            out.extend(str(k) for k in v)
            todo.extend(v.values())
        elif isinstance(v, (list, tuple)):
            todo.extend(v)
        elif isinstance(v, str):
            out.append(v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(str(v))
    return out


def check_write(summary: str | None = "", content: str | None = "", kind: str | None = "",
                labels: dict[str, str] | None = None, metadata: object = None, key: str | None = "",
                **texts: str | None) -> FieldRefusal | None:
    """The first field of a write that the filter refuses, or None: every write an agent, a
    tool or a model makes goes through here. Each field is checked on its own, so a refusal
    names it; `texts` adds more named fields (a block's `label` and `line`)."""
    fields: list[tuple[str, list[str]]] = [
        ("summary", [summary or ""]),
        ("content", [content or ""]),
        ("kind", [kind or ""]),
        ("key", [key or ""]),  # a fact's key is rendered to the model beside its text
        *((name, [text or ""]) for name, text in texts.items()),
        ("labels", _scalars(labels or {})),
        ("metadata", _scalars(metadata or {})),
    ]
    for name, values in fields:
        values = [v for v in values if v]
        if values and (hit := _check_field(values)):
            return FieldRefusal(name, hit)
    # A transcript or a secret can be split between summary and content: read together too.
    if summary and content and (hit := _check_text(f"{summary}\n{content}")):
        return FieldRefusal("content", hit)
    return None
