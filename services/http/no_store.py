"""`Cache-Control: no-store` on every answer that does not set its own: most answers can hold a
member's facts, and no browser or proxy cache may keep them."""

from __future__ import annotations

from typing import Any

_CACHE_CONTROL = b"cache-control"
_NO_STORE = (_CACHE_CONTROL, b"no-store")


class NoStore:
    """ASGI middleware adding `_NO_STORE` when the response has no Cache-Control header."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_no_store(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = message.get("headers", [])
                if not any(k.lower() == _CACHE_CONTROL for k, _ in headers):
                    message = {**message, "headers": [*headers, _NO_STORE]}
            await send(message)

        await self.app(scope, receive, send_no_store)
