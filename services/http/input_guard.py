"""Refusals every request body gets before any route sees it.

- A body larger than any command the broker could carry: 413 `LIMIT_EXCEEDED`, answered as
  soon as the bytes read pass the limit.
- Text that cannot be encoded as UTF-8 (a lone surrogate, which JSON can spell as
  `"\\ud800"` and raw bytes as ED A0 80): 422 naming the field. Redis, Kafka and the index all
  store UTF-8, so such text would fail deep inside a write or a lookup instead.
- Bytes that are not UTF-8 at all: 422 naming the body and the byte.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi.responses import JSONResponse

from events.errors import ErrorCode
from events.limits import unencodable

# Larger than the broker's 1 MiB message limit with room for JSON escaping: no valid
# request comes near it, and no route has to hold a bigger one in memory.
MAX_BODY_BYTES = 2 * 1024 * 1024
# A JSON escape of a lone UTF-16 surrogate: a high one not followed by a low one, or a low
# one not preceded by a high one. Only a body holding one is parsed again and walked; an
# escaped pair (an emoji) is one character and costs nothing more.
# Surrogate escapes are found with one plain pattern (a lookbehind tried at every byte
# costs 50x more) and their neighbours checked here.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_LOW = re.compile(rb"\\u[dD][c-fC-F][0-9a-fA-F]{2}")


def _lone_surrogate(body: bytes) -> bool:
    """Whether the body may hold a lone surrogate: True sends it to the parse and walk, which decide."""
    paired_low = -1  # where the low half of the last pair starts
    for m in _SURROGATE_ESCAPE.finditer(body):
        start = m.start()
        if start and body[start - 1] == 0x5C:
            return True  # `\\ud800` is a backslash and text, or an escape after one: let the parse tell
        if _LOW.match(body, start):
            if start != paired_low:
                return True  # a low half with no high one before it
        elif _LOW.match(body, start + 6):
            paired_low = start + 6
        else:
            return True  # a high half with no low one after it
    return False


_READS = frozenset({"GET", "HEAD", "OPTIONS"})


def unencodable_field(value: Any) -> str | None:
    """The dotted path of the first key or string in `value` that is not valid UTF-8 text
    ("" for the top level), or None. Iterative, so a deeply nested body cannot exhaust the
    stack; each node links to its parent, and only the bad one's path is ever spelled."""
    todo: list[tuple[Any, tuple | None]] = [(value, None)]  # (node, (name, parent link) or None)
    while todo:
        v, link = todo.pop()
        if isinstance(v, str):
            if not v.isascii() and unencodable(v):
                return _path(link)
        elif isinstance(v, dict):
            for k, item in v.items():
                if isinstance(k, str) and unencodable(k):
                    return _path(link) or "(key)"
                todo.append((item, (k, link)))
        elif isinstance(v, list):
            todo.extend((item, (i, link)) for i, item in enumerate(v))
    return None


def _path(link: tuple | None) -> str:
    names = []
    while link is not None:
        name, link = link
        names.append(str(name))
    return ".".join(reversed(names))


TOO_LARGE = (413, "body", f"body: at most {MAX_BODY_BYTES} bytes; send less (a memory's metadata is far smaller)")


def body_refusal(body: bytes) -> tuple[int, str, str] | None:
    """(status, field, message) when `body` must be refused before routing, else None."""
    if len(body) > MAX_BODY_BYTES:
        return TOO_LARGE
    if not body.isascii():
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as e:
            # json.loads reads bytes with surrogatepass: a surrogate's raw bytes become a lone
            # surrogate, named by its field below; any other bad byte has no field to name.
            try:
                body.decode("utf-8", "surrogatepass")
            except UnicodeDecodeError:
                return 422, "body", (f"body: not UTF-8 (byte {e.start} is {body[e.start]:#04x}); "
                                     "send JSON encoded as UTF-8")
            return _field_refusal(body) or (422, "body", f"body: not UTF-8 at byte {e.start}; send JSON encoded as UTF-8")
    if not _lone_surrogate(body):
        return None
    return _field_refusal(body)


def _field_refusal(body: bytes) -> tuple[int, str, str] | None:
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
        refusal = None
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                refusal = TOO_LARGE  # answered now: the rest of the body is never read
                break
            chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        body = b"".join(chunks)
        refusal = refusal or body_refusal(body)
        if refusal is not None:
            status, field, message = refusal
            code = ErrorCode.LIMIT_EXCEEDED if status == 413 else ErrorCode.VALIDATION_FAILED
            answer: dict[str, Any] = {"error": {"code": code, "field": field, "message": message}}
            if scope.get("path", "").startswith("/mcp"):  # an MCP client reads JSON-RPC errors (parse error: -32700)
                answer = {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": message}}
            await JSONResponse(answer, status_code=status)(scope, receive, send)
            return
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
