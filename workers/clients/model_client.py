"""Calls an OpenAI-compatible chat model for a JSON answer, with bounded retries.

- Each HTTP call has a timeout. 429s, 5xx answers, timeouts and dropped connections are
  retried `model_retries` times with exponential backoff; other 4xx answers are not, since
  asking again cannot fix them.
- An answer that is not valid JSON for the schema gets one repair attempt: the model sees
  its own output and the validation error, once.
- Every call, failed or not, becomes a `ModelUsage` record, so retries show up as cost.
  The caller sends those records with its other outputs, in the same Kafka transaction.
- When the budget is spent, `ModelFailed` carries the usage records so far; the caller
  decides what to do with the turn (the extraction worker dead-letters it).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar, cast

import openai
import structlog
from openai import AsyncOpenAI
from pydantic_core import to_json

from events.base import utcnow
from events.rules.model_answer import Malformed
from events.usage import ModelUsage
from settings import Settings
from workers.runtime import metrics

log = structlog.get_logger()
T = TypeVar("T")
USAGE_NS = uuid.UUID("a1d3c8e2-6b0f-4d7e-9a51-3c2f0b7e4d19")


class ModelFailed(Exception):
    def __init__(self, error: str, attempts: int, usage: list[ModelUsage]) -> None:
        super().__init__(error)
        self.error, self.attempts, self.usage = error, attempts, usage


@dataclass
class CallContext:
    """Who the call is for: it names the usage records (deterministically, per turn attempt)."""

    tenant: str
    agent: str
    session: str | None
    execution_id: str | None
    turn: int | None
    id_seed: str


@dataclass
class Answer(Generic[T]):
    value: T
    usage: list[ModelUsage] = field(default_factory=list)
    attempts: int = 1


def _http_client() -> Any:
    """The HTTP client under the openai package: aiohttp's when it is installed.

    Why: the default httpx pool probes every idle keep-alive connection's socket each time a
    request starts or ends. A worker with hundreds of reviews in flight keeps hundreds of
    connections, and those probes cost more CPU than the rest of a review. aiohttp's pool
    hands out a connection without probing the others. Same requests, errors and timeouts
    (the openai package maps aiohttp's exceptions to its own).
    """
    try:
        return openai.DefaultAioHttpClient()
    except (AttributeError, RuntimeError):  # an openai without aiohttp support, or no aiohttp
        return None


def make_openai(settings: Settings) -> AsyncOpenAI:
    # The client's own retries are off: ours are bounded, logged and recorded as usage.
    return AsyncOpenAI(
        base_url=settings.openai_base_url or None,
        api_key=settings.openai_api_key or "not-needed",
        max_retries=0,
        timeout=settings.model_timeout_s,
        http_client=_http_client(),
    )


def _retryable(e: Exception) -> str | None:
    """Why a failed request is worth making again (None: it is not), from its metric reason."""
    reason = metrics.model_error_reason(e)
    if reason == "server_error":
        return f"server error ({cast(openai.APIStatusError, e).status_code})"  # only a status error is one
    return {"rate_limited": "rate limited (429)", "timeout": "timeout", "connection": "connection failed"}.get(reason)


def answer_text(resp: Any) -> str:
    """The JSON the model produced: a tool call's arguments, else the message content.

    `resp` is the response body as JSON (a dict): the wire format, not the openai package's
    typed objects, whose construction cost more CPU than the rest of the answer handling.
    """
    if isinstance(resp, str | bytes):  # a server that did not say its body is JSON
        try:
            resp = json.loads(resp)
        except ValueError:
            raise Malformed("the response is not JSON") from None
    if not isinstance(resp, dict):
        raise Malformed(f"the response is a JSON {type(resp).__name__}, not an object")
    choices = resp.get("choices")
    if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
        raise Malformed("the response has no choices")
    msg = choices[0].get("message")
    if not isinstance(msg, dict):
        raise Malformed("the response's first choice has no message")
    calls = msg.get("tool_calls")
    if calls and isinstance(calls, list):
        fn = calls[0].get("function") if isinstance(calls[0], dict) else None
        args = fn.get("arguments") if isinstance(fn, dict) else None
        return args if isinstance(args, str) else ""
    content = msg.get("content")
    return content if isinstance(content, str) else ""


SCHEMA_NAMES = {"memory": "review", "consolidation": "consolidation"}  # the answer's name, per purpose


@dataclass
class _Spent:
    """What one `json_call` has spent so far: the messages it sends (a repair adds to them),
    its usage records, its attempts, its transient failures and whether it asked for a repair."""

    messages: list[dict[str, Any]]
    usage: list[ModelUsage] = field(default_factory=list)
    attempt: int = 0
    transient_failures: int = 0
    repaired: bool = False


class ModelClient:
    def __init__(self, settings: Settings, client: AsyncOpenAI | None = None) -> None:
        self.settings = settings
        self.model = settings.model
        self.client = client or make_openai(settings)

    async def close(self) -> None:
        await self.client.close()

    async def json_call(
        self,
        messages: list[dict[str, Any]],
        schema: dict[str, Any],
        parse: Callable[[str], T],
        ctx: CallContext,
        purpose: str = "memory",
    ) -> Answer[T]:
        spent = _Spent(list(messages))
        while True:
            spent.attempt += 1
            t0 = time.perf_counter()
            try:
                resp = await self._post(spent.messages, schema, purpose)
            except Exception as e:
                await self._after_failed_request(e, spent, ctx, purpose, t0)
                continue
            text = ""
            try:
                text = answer_text(resp)
                value = parse(text)
            except (Malformed, ValueError) as e:
                self._ask_for_repair(e, text, resp, spent, ctx, purpose, t0)
                continue
            spent.usage.append(self._usage(ctx, purpose, spent.attempt, t0, resp, None))
            return Answer(value, spent.usage, spent.attempt)

    async def _post(self, messages: list[dict[str, Any]], schema: dict[str, Any], purpose: str) -> Any:
        """One request for the answer, as parsed JSON."""
        # The client's low-level post, not `chat.completions.create`: the body is
        # already in wire format, and `create` walks it (the JSON schema included)
        # against the typed parameters on every call, which cost more CPU than the rest
        # of a review. Errors, timeouts and the parsed answer are the same.
        # `cast_to=object`: the answer as parsed JSON, without building the typed
        # ChatCompletion (`answer_text` and `_usage` read the few fields they need).
        # `content`: the body serialized here, by pydantic-core's JSON writer; the
        # client's own `json.dumps` of it (the schema included) cost about a tenth of
        # the worker's CPU. The client's default Content-Type is application/json.
        return await self.client.post(
            "/chat/completions",
            cast_to=object,
            content=to_json(
                {
                    "model": self.model,
                    "messages": messages,
                    "response_format": {"type": "json_schema", "json_schema": {"name": SCHEMA_NAMES[purpose], "schema": schema, "strict": True}},
                    "temperature": 0,
                }
            ),
            options={"timeout": self.settings.model_timeout_s},
        )

    async def _after_failed_request(self, e: Exception, spent: _Spent, ctx: CallContext, purpose: str,
                                    t0: float) -> None:
        """Records the failed request, then waits out the backoff before the next one, or raises
        ModelFailed when asking again cannot help or the retry budget is spent."""
        s = self.settings
        why = _retryable(e)
        spent.usage.append(self._usage(ctx, purpose, spent.attempt, t0, None, f"{why or type(e).__name__}: {e}"[:500]))
        metrics.MODEL_ERRORS.labels(purpose, metrics.model_error_reason(e)).inc()
        if why is None:
            metrics.MODEL_FAILED.labels(purpose).inc()
            raise ModelFailed(f"model call failed and is not retryable: {type(e).__name__}: {e}", spent.attempt,
                              spent.usage) from e
        spent.transient_failures += 1
        if spent.transient_failures > s.model_retries:
            metrics.MODEL_FAILED.labels(purpose).inc()
            raise ModelFailed(
                f"model call failed {spent.transient_failures} times (limit model_retries={s.model_retries}); last: {why}",
                spent.attempt,
                spent.usage,
            ) from e
        delay = min(s.model_backoff_s * 2 ** (spent.transient_failures - 1), 10.0)
        log.warning("model_call_retrying", reason=why, attempt=spent.attempt, delay_s=delay, agent=ctx.agent, turn=ctx.turn)
        metrics.MODEL_RETRIES.labels(purpose, "transient").inc()
        await asyncio.sleep(delay)

    def _ask_for_repair(self, e: Exception, text: str, resp: Any, spent: _Spent, ctx: CallContext, purpose: str,
                        t0: float) -> None:
        """Records the malformed answer and shows the model its output and the error, once;
        a second malformed answer raises ModelFailed."""
        spent.usage.append(self._usage(ctx, purpose, spent.attempt, t0, resp, f"malformed: {e}"[:500]))
        metrics.MODEL_ERRORS.labels(purpose, "malformed").inc()
        if spent.repaired:
            metrics.MODEL_FAILED.labels(purpose).inc()
            raise ModelFailed(f"model output is malformed after one repair attempt: {e}", spent.attempt,
                              spent.usage) from e
        spent.repaired = True
        metrics.MODEL_RETRIES.labels(purpose, "repair").inc()
        log.warning("model_output_malformed_repairing", error=str(e)[:300], agent=ctx.agent, turn=ctx.turn)
        spent.messages = spent.messages + [
            {"role": "assistant", "content": text[:4000]},
            {
                "role": "user",
                "content": f"That answer is invalid: {str(e)[:1000]}. Reply again with only a JSON object "
                f"that matches the schema.",
            },
        ]

    def _usage(self, ctx: CallContext, purpose: str, attempt: int, t0: float, resp: Any, error: str | None) -> ModelUsage:
        body: Any = resp if isinstance(resp, dict) else {}
        u: dict[str, Any] = body.get("usage") if isinstance(body.get("usage"), dict) else {}
        metrics.model_request(purpose, time.perf_counter() - t0, error, _count(u.get("prompt_tokens")),
                              _count(u.get("completion_tokens")))
        return ModelUsage(
            usage_id=str(uuid.uuid5(USAGE_NS, f"{ctx.id_seed}/{purpose}/{attempt}")),
            tenant=ctx.tenant,
            agent=ctx.agent,
            occurred_at=utcnow(),
            session=ctx.session,
            execution_id=ctx.execution_id,
            turn=ctx.turn,
            purpose=cast('Literal["memory", "consolidation", "embed"]', purpose),  # the model validates it
            model=body.get("model") if isinstance(body.get("model"), str) and body.get("model") else self.model,
            input_tokens=_count(u.get("prompt_tokens")),
            output_tokens=_count(u.get("completion_tokens")),
            latency_ms=round((time.perf_counter() - t0) * 1000, 2),
            ok=error is None,
            error=error,
        )


def _count(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0
