"""Refusals every request body gets before any route sees it.

- A body larger than any command the broker could carry: 413.
- Text that cannot be encoded as UTF-8 (a lone surrogate, which JSON can spell as
  `"\\ud800"`): 422 naming the field. Redis, Kafka and the index all store UTF-8, so such
  text would fail deep inside a write or a lookup instead.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi.responses import JSONResponse

# Larger than the broker's 1 MiB message limit with room for JSON escaping: no valid
# request comes near it, and no route has to hold a bigger one in memory.
MAX_BODY_BYTES = 2 * 1024 * 1024
# A JSON escape of a UTF-16 surrogate (paired or not): only bodies holding one are walked.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_READS = frozenset({"GET", "HEAD", "OPTIONS"})


def unencodable(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def unencodable_field(value: Any) -> str | None:
    """The dotted path of the first key or string in `value` that is not valid UTF-8 text
    ("" for the top level), or None. Iterative, so a deeply nested body cannot exhaust the stack."""
    todo: list[tuple[str, Any]] = [("", value)]
    while todo:
        path, v = todo.pop()
        if isinstance(v, str):
            if unencodable(v):
                return path
        elif isinstance(v, dict):
            for k, item in v.items():
                name = f"{path}.{k}" if path else str(k)
                if isinstance(k, str) and unencodable(k):
                    return path or "(key)"
                todo.append((name, item))
        elif isinstance(v, list):
            todo.extend((f"{path}.{i}" if path else str(i), item) for i, item in enumerate(v))
    return None


TOO_LARGE = (413, "body", f"body: at most {MAX_BODY_BYTES} bytes; send less (a memory's metadata is far smaller)")


def body_refusal(body: bytes) -> tuple[int, str, str] | None:
    """(status, field, message) when `body` must be refused before routing, else None."""
    if len(body) > MAX_BODY_BYTES:
        return TOO_LARGE
    if not _SURROGATE_ESCAPE.search(body):
        return None
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return None  # the route answers a malformed body itself
    field = unencodable_field(parsed)
    if field is None:
        return None
    # A name built from an unencodable key cannot be sent back either.
    shown = field if not unencodable(field) else field.encode("utf-8", "backslashreplace").decode()
    return 422, shown, f"{shown}: text that cannot be encoded as UTF-8 (a lone surrogate); send valid Unicode text"


class GuardBodies:
    """ASGI middleware applying `body_refusal` to every request that carries a body."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in _READS:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size <= MAX_BODY_BYTES:
                chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        body = b"".join(chunks)
        refusal = TOO_LARGE if size > MAX_BODY_BYTES else body_refusal(body)
        if refusal is not None:
            status, field, message = refusal
            code = "TOO_LARGE" if status == 413 else "VALIDATION_FAILED"
            await JSONResponse({"error": {"code": code, "field": field, "message": message}}, status_code=status)(
                scope, receive, send
            )
            return
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
