"""A scripted OpenAI-compatible model server, for tests only.

It speaks the wire format the `openai` package uses: `POST /v1/chat/completions` (content
or tool-call answers, with `usage`) and `POST /v1/embeddings`. Each test scripts its
answers, routed by a string the request must contain (a marker unique to the test), so
tests sharing one server never take each other's answers:

    fake.on("marker-123", Reply({"candidates": [...]}), Status(429), Delay(5, Reply(...)))

Unrouted requests get `default` (no candidates). Every chat request is kept in
`fake.requests` so tests can assert what the model was sent.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import uvloop
from aiohttp import web
from pydantic_core import from_json, to_json

from services.stack import free_port


@dataclass
class Reply:
    """A JSON answer in the message content (as `response_format` json_schema returns it)."""

    data: Any
    as_tool_call: bool = False


@dataclass
class Raw:
    """Content returned verbatim: for malformed output."""

    text: str


@dataclass
class Status:
    code: int
    message: str = "scripted error"


@dataclass
class Delay:
    seconds: float
    then: Any = None


class Held:
    """A scripted answer the fake keeps back until `release` (a barrier, not a delay): the fake
    waits on a `Delay` whose next answer is itself, polling, until it is given the real one. A
    call the client gives up on meanwhile is retried, and the retry is held the same way when
    the route holds this answer again."""

    def __init__(self) -> None:
        self.answer = Delay(0.05)
        self.answer.then = self.answer

    def release(self, then: Any) -> None:
        self.answer.then = then


@dataclass
class Route:
    match: str
    answers: deque = field(default_factory=deque)
    hits: int = 0
    # Once its answers are used up, a route matches nothing more: for a match as wide as a schema
    # name on a server every module of a session shares.
    until_used: bool = False


def _dumps(data: Any) -> str:
    # pydantic-core's JSON writer: the fake shares the benchmark's two cores with memlane.
    return to_json(data).decode()


def hashed_embedding(text: str, dim: int) -> np.ndarray:
    """Bag-of-words hashing: texts sharing words get similar vectors, deterministically."""
    v = np.zeros(dim, dtype=np.float32)
    for w in re.findall(r"\w+", text.lower()):
        h = int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")
        v[h % dim] += 1.0 if (h >> 32) & 1 else -1.0
    n = float(np.linalg.norm(v))
    if n == 0:
        v[0] = 1.0
        n = 1.0
    return v / n


class FakeModel:
    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.routes: list[Route] = []
        self.requests: list[dict[str, Any]] = []
        self.embedding_calls = 0
        self.default: Any = Reply({"candidates": []})
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ scripting

    def on(self, match: str, *answers: Any, until_used: bool = False) -> Route:
        route = Route(match, deque(answers), until_used=until_used)
        with self._lock:
            self.routes.append(route)
        return route

    def requests_with(self, match: str) -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self.requests if match in json.dumps(r)]

    def _next(self, body: dict[str, Any]) -> Any:
        with self._lock:
            self.requests.append(body)
            routes = list(self.routes)
        # Serialized only to match routes: a benchmark's unrouted requests skip it.
        text = json.dumps(body) if routes else ""
        with self._lock:
            matching = [r for r in routes if r.match in text and not (r.until_used and not r.answers)]
            # A route with answers left goes first: a later turn's prompt can quote an earlier
            # turn's marker (its fact shown as an existing memory), and that earlier route, used
            # up, must not answer for the later one with the default.
            if matching:
                route = min(matching, key=lambda r: not r.answers)  # the first with answers, else the first
                route.hits += 1
                return route.answers.popleft() if route.answers else self._default(body)
        return self._default(body)

    def _default(self, body: dict[str, Any]) -> Any:
        # `default` may be a function of the request, for answers that echo the input.
        return self.default(body) if callable(self.default) else self.default

    # ------------------------------------------------------------------ wire format

    def _completion(self, body: dict[str, Any], answer: Reply | Raw) -> dict[str, Any]:
        content = answer.text if isinstance(answer, Raw) else json.dumps(answer.data)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if isinstance(answer, Reply) and answer.as_tool_call:
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "review", "arguments": content}}],
            }
        prompt_chars = sum(len(str(m.get("content") or "")) for m in body.get("messages", []))
        return {
            "id": f"chatcmpl-{hashlib.md5(content.encode()).hexdigest()[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "fake"),
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if "tool_calls" in message else "stop"}],
            "usage": {"prompt_tokens": prompt_chars // 4, "completion_tokens": len(content) // 4, "total_tokens": (prompt_chars + len(content)) // 4},
        }

    async def _chat(self, request: web.Request) -> web.Response:
        body = from_json(await request.read())
        answer = self._next(body)
        while isinstance(answer, Delay):
            await asyncio.sleep(answer.seconds)
            answer = answer.then if answer.then is not None else self._default(body)
        if isinstance(answer, Status):
            kind = "rate_limit_exceeded" if answer.code == 429 else "server_error"
            return web.json_response({"error": {"message": answer.message, "type": kind, "code": kind}},
                                     status=answer.code)
        return web.json_response(self._completion(body, answer), dumps=_dumps)

    async def _embeddings(self, request: web.Request) -> web.Response:
        body = from_json(await request.read())
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        dim = int(body.get("dimensions") or 384)
        with self._lock:
            self.embedding_calls += 1
        # The openai package asks for base64 (packed float32) by default, as the real API
        # allows; answering with lists instead makes the client build a Python object per
        # float, which would dominate what the benchmarks measure.
        b64 = body.get("encoding_format") == "base64"
        data = [
            {"object": "embedding", "index": i,
             "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if b64 else v.tolist()}
            for i, v in enumerate(hashed_embedding(t, dim) for t in inputs)
        ]
        tokens = sum(len(t) for t in inputs) // 4
        return web.json_response(
            {"object": "list", "data": data, "model": body.get("model", "fake"),
             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}},
            dumps=_dumps,
        )

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> FakeModel:
        """Serves on its own thread and loop. aiohttp on uvloop rather than a full web
        framework: the benchmarks share two cores with it, and what they measure is memlane,
        not the fake."""
        started = threading.Event()

        async def serve() -> None:
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_post("/v1/chat/completions", self._chat)
            app.router.add_post("/v1/embeddings", self._embeddings)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            self._loop, self._stopped = asyncio.get_running_loop(), asyncio.Event()
            started.set()
            try:
                await self._stopped.wait()
            finally:
                await runner.cleanup()

        self._thread = threading.Thread(target=uvloop.run, args=(serve(),), name="fake-model", daemon=True)
        self._thread.start()
        if not started.wait(timeout=15):
            raise RuntimeError(f"fake model server did not start on port {self.port}")
        return self

    def stop(self) -> None:
        if self._loop is not None:
            assert self._stopped is not None  # set together with the loop
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread:
            self._thread.join(timeout=10)
