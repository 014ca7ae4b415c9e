"""structlog JSON logs, shared by every process.

Logs never hold input values: what a caller or a model sent (a summary, a query, a turn's
text) can be the very secret or personal data memory refuses to keep. `redact` runs last on
every structlog event, and `RedactingFormatter` on every standard-library line (uvicorn,
aiokafka), tracebacks included.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

import structlog

REDACTED = "[redacted]"
# Event keys whose values are user or model text, whatever the event.
TEXT_KEYS = frozenset({
    "summary", "content", "text", "query", "metadata", "input", "value", "line", "old", "labels", "arguments",
    "messages", "message_text", "prompt", "answer", "body", "input_value",
})
# pydantic writes the offending input into its messages: "[type=..., input_value='...', input_type=str]".
# The value runs to the last ", input_type=" of its line, or to the line's end when it was cut off.
_INPUT_VALUE = re.compile(r"input_value=(?:.*, input_type=|[^\n]*)")


def scrub(text: str) -> str:
    """`text` without the input values pydantic puts in its errors."""
    if "input_value=" not in text:
        return text
    return _INPUT_VALUE.sub(lambda m: f"input_value={REDACTED}" + (", input_type=" if m.group().endswith(
        ", input_type=") else ""), text)


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {k: REDACTED if k in TEXT_KEYS else _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, BaseException):
        return scrub(f"{type(value).__name__}: {value}")
    return value


def redact(_logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
    """The structlog processor: user-text keys blanked, input values cut from every string
    (the rendered exception and traceback included)."""
    return {k: REDACTED if k in TEXT_KEYS else _clean(v) for k, v in event.items()}


class RedactingFormatter(logging.Formatter):
    """Standard-library lines (and their tracebacks) with pydantic's input values cut out."""

    def format(self, record: logging.LogRecord) -> str:
        return scrub(super().format(record))


def configure(level: str = "INFO", service: str = "memlane") -> None:
    logging.basicConfig(stream=sys.stderr, level=level, format="%(message)s")
    for handler in logging.getLogger().handlers:
        handler.setFormatter(RedactingFormatter("%(message)s"))
    # httpx2 is the HTTP client under openai: a line per model or embedding request, at
    # hundreds per second, cost the extraction worker more CPU than its own logging.
    for noisy in ("aiokafka", "kafka", "httpx", "httpx2", "httpcore", "httpcore2", "uvicorn.access"):
        logging.getLogger(noisy).setLevel("WARNING")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redact,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service)
