"""ASGI middleware, added only with tracing on: each request is a server span, child of the
caller's `traceparent` header, current while it is handled, so what the request writes to
the log carries the trace on (`services.memory.kafka`)."""

from __future__ import annotations

from typing import Any

from workers.runtime.tracing import TRACEPARENT, OtelTracing


class Traced:
    def __init__(self, app: Any, tracing: OtelTracing) -> None:
        self.app = app
        self.tracing = tracing

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        parent = next((v.decode(errors="replace") for k, v in scope.get("headers", ()) if k == TRACEPARENT.encode()), None)
        status: dict[str, int] = {}

        async def send_noting(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        # Named by method alone until routed: a path holds ids, which a span name must not.
        with self.tracing.served(scope["method"], parent, **{"http.request.method": scope["method"]}) as span:
            try:
                await self.app(scope, receive, send_noting)
            finally:
                route = scope.get("route")
                if (template := getattr(route, "path", None)) is not None:
                    span.update_name(f"{scope['method']} {template}")
                    span.set_attribute("http.route", template)
                if "code" in status:
                    span.set_attribute("http.response.status_code", status["code"])
