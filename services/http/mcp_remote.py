"""Remote MCP: the memory tools over MCP's streamable HTTP transport, at `/mcp` on the API.

A request carries the key as a bearer token, and X-Session, X-User, X-Channel and the origin
headers (X-Execution-Id, X-Invocation, X-Agent-Version) as `memlane mcp` takes them from its
environment; an operator key names its tenant (X-Tenant). The tools are built for that key as the stdio server builds them
(`services.mcp_server`) and call the API as that key, so the per-key tool list and every refusal
are the same. The transport is stateless and answers in JSON: each request is served on its own,
so a client's slow call holds no other client's. A key's server is kept for a minute (a changed
configuration shows within it); its calls are checked by the API each time, so a revoked key is
refused at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from services.client import MemlaneClient, MemlaneError
from services.mcp_server import StartRefused, build_admin_mcp, build_mcp

KEEP_S = 60.0
MOST = 256  # servers kept at once; the least recently used is closed first
GRACE_S = 30.0  # a server replaced or dropped still answers the requests it took for this long
# The headers a request's tools call the API with, and the client's argument each one is.
HEADERS = {"x-session": "session", "x-user": "user", "x-channel": "channel", "x-tenant": "tenant",
           "x-agent": "agent", "x-execution-id": "execution_id", "x-invocation": "invocation",
           "x-agent-version": "agent_version"}
NUMBERS = ("invocation", "agent_version")


@dataclass
class _Served:
    manager: StreamableHTTPSessionManager
    client: MemlaneClient
    stop: asyncio.Event
    task: asyncio.Task
    made: float


class RemoteMcp:
    """The ASGI app at `/mcp`. `api_url`: where its tools call the API (this deployment's)."""

    def __init__(self, api_url: str) -> None:
        self.api_url = api_url
        self.served: OrderedDict[tuple[str | None, ...], _Served] = OrderedDict()
        self.starting: dict[tuple[str | None, ...], asyncio.Future[_Served]] = {}
        self._closing: set[asyncio.Future[None]] = set()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        auth = headers.get("authorization", "")
        if not auth.lower().startswith("bearer ") or not auth[7:].strip():
            return await _refuse(send, 401, "authorization: send the API key as a bearer token "
                                 "(Authorization: Bearer <key>)")
        ident = (auth[7:].strip(), *(headers.get(h) for h in HEADERS))
        bad = next((h for h, arg in HEADERS.items() if arg in NUMBERS and not (headers.get(h) or "0").isdigit()), None)
        if bad is not None:
            return await _refuse(send, 422, f"{bad}: a whole number")
        try:
            served = await self._server(ident)
        except StartRefused as e:
            return await _refuse(send, 403, str(e))
        except MemlaneError as e:
            return await _refuse(send, e.status, f"{e.field or 'authorization'}: {e.message}")
        await served.manager.handle_request(scope, receive, send)

    async def _server(self, ident: tuple[str | None, ...]) -> _Served:
        """The key's server: kept, or started. A start (two calls to the API) holds no other
        key's request: each waits only for its own."""
        served = self.served.get(ident)
        if served is not None and time.monotonic() - served.made < KEEP_S:
            self.served.move_to_end(ident)
            return served
        starting = self.starting.get(ident)
        if starting is None:
            starting = self.starting[ident] = asyncio.ensure_future(self._start(ident))
            starting.add_done_callback(lambda _: self.starting.pop(ident, None))
        new = await asyncio.shield(starting)
        if self.served.get(ident) is not new:
            old = self.served.pop(ident, None)
            self.served[ident] = new
            for gone in [old] + [self.served.popitem(last=False)[1] for _ in range(len(self.served) - MOST)]:
                if gone is not None:
                    self._closing.add(t := asyncio.ensure_future(self._close(gone, GRACE_S)))
                    t.add_done_callback(self._closing.discard)
        return new

    async def _start(self, ident: tuple[str | None, ...]) -> _Served:
        key, *values = ident
        args: dict[str, Any] = {arg: (int(v) if arg in NUMBERS else v) for arg, v in zip(HEADERS.values(), values,
                                                                                          strict=True) if v is not None}
        client = MemlaneClient(self.api_url, key or "", **args)
        try:
            role = (await client.whoami())["role"]
            if role == "member":
                raise StartRefused("a member key lists, edits and deletes its member's facts over the HTTP API; the "
                                   "MCP tools are the agent's: use the agent's key, with X-User naming the member")
            server = build_admin_mcp(client) if role == "operator" else build_mcp(client, await client.config(), role)
        except BaseException:
            await client.aclose()
            raise
        manager = StreamableHTTPSessionManager(app=server._lowlevel_server, json_response=True, stateless=True)
        started, stop = asyncio.Event(), asyncio.Event()

        async def run() -> None:
            # The manager's task group must be entered and left by one task: this one.
            async with manager.run():
                started.set()
                await stop.wait()

        task = asyncio.create_task(run(), name="mcp-remote")
        await started.wait()
        return _Served(manager, client, stop, task, time.monotonic())

    @staticmethod
    async def _close(served: _Served, grace: float = 0.0) -> None:
        """Stops a server, after `grace` s for the requests it is serving (stopping cancels them)."""
        await asyncio.sleep(grace)
        served.stop.set()
        with contextlib.suppress(Exception):
            await served.task
        await served.client.aclose()

    async def aclose(self) -> None:
        for t in self._closing:
            t.cancel()
        await asyncio.gather(*self._closing, return_exceptions=True)
        while self.served:
            await self._close(self.served.popitem()[1])


async def _refuse(send: Any, status: int, message: str) -> None:
    """A JSON-RPC error with no id, as the transport answers a request it cannot take."""
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32001, "message": message}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
                + ([(b"www-authenticate", b"Bearer")] if status == 401 else [])})
    await send({"type": "http.response.body", "body": body})
