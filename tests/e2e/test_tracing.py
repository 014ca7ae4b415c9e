"""Traces across the pipeline, read back from a real OTLP receiver: a turn published inside
the platform's span, and a write sent inside the caller's, each reach the memory index in one
trace whose spans chain parent to child across the workers' processes. The model stack
traces; every other stack runs with tracing off."""

from __future__ import annotations

import random
import uuid

import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from services.client import MemlaneClient, TurnPublisher
from tests.conftest import eventually
from tests.e2e.extraction_support import answer, new_agent, turn


@pytest.fixture(scope="module")
def xstack(model_stack):
    return model_stack


def platform_span() -> tuple[str, str, NonRecordingSpan]:
    """The platform's span, as its own tracer would have made it: (trace id, span id, span)."""
    trace_id, span_id = random.getrandbits(128), random.getrandbits(64)
    ctx = SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return f"{trace_id:032x}", f"{span_id:016x}", NonRecordingSpan(ctx)


async def spans_until(otlp, trace_id: str, *names: str):
    """The trace's spans, once each of `names` (a name's prefix) has ended in it."""
    async def done():
        spans = otlp.trace(trace_id)
        return spans if all(any(s.name.startswith(n) for s in spans) for n in names) else None

    try:
        return await eventually(done, timeout=40)
    except AssertionError:
        raise AssertionError(f"spans of the trace: {[(s.name, s.service) for s in otlp.trace(trace_id)]}") from None


def chained(spans, root: str) -> None:
    """Every span's parent is the root or another span of the trace: one tree, no orphans."""
    ids = {s.span_id for s in spans} | {root}
    orphans = [(s.name, s.service) for s in spans if s.parent_id not in ids]
    assert not orphans, orphans


def child(spans, name: str, parent_name: str) -> None:
    parents = {s.span_id for s in spans if s.name.startswith(parent_name)}
    assert any(s.name.startswith(name) and s.parent_id in parents for s in spans), (
        name, parent_name, [(s.name, s.parent_id) for s in spans])


async def test_a_turn_is_one_trace_from_the_platforms_publish_to_the_memory_index(xstack, fake, otlp):
    stack, settings = xstack
    tenant, agent, key = await new_agent(stack.api_url, settings.operator_key)
    m = f"mk{uuid.uuid4().hex[:10]}"
    summary = f"The customer {m} pays by bank transfer"
    fake.on(m, answer({"decision": "add", "handle": None, "kind": "fact", "labels": {}, "scope": "session",
                       "summary": summary, "content": "", "source_message_ids": ["s1-1-0"]}))
    trace_id, root, span = platform_span()
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
        with trace.use_span(span):  # the publisher carries the current span on as `traceparent`
            await pub.publish(turn(tenant, agent, "s1", 1, f"I am {m} and I pay by bank transfer", "Noted."))
    async with MemlaneClient(stack.api_url, key, session="s1") as c:
        async def found():
            hits, _ = await c.search_memory("bank transfer", limit=5)
            return hits or None

        await eventually(found, timeout=40)
    spans = await spans_until(otlp, trace_id, "extraction ", "ledger ", "embedding ", "redis-projection ",
                              "memory-index memlane.memory.events", "memory-index memlane.vectors")
    chained(spans, root)
    assert any(s.name.startswith("extraction ") and s.parent_id == root for s in spans)
    child(spans, "ledger ", "extraction ")
    child(spans, "embedding ", "ledger ")
    child(spans, "memory-index memlane.memory.events", "ledger ")
    child(spans, "memory-index memlane.vectors", "embedding ")
    assert {s.service for s in spans} >= {"memlane-worker-extraction", "memlane-worker-ledger",
                                          "memlane-worker-embedding", "memlane-api"}
    # Offsets and names, never what was said or remembered.
    values = " ".join(f"{s.name} {s.attributes}" for s in spans)
    assert m not in values and "bank transfer" not in values


async def test_an_api_write_joins_the_callers_trace(xstack, otlp):
    stack, settings = xstack
    _, _, key = await new_agent(stack.api_url, settings.operator_key)
    trace_id, root, span = platform_span()
    async with MemlaneClient(stack.api_url, key, session="s1") as c:
        with trace.use_span(span):  # the client sends the current span on as `traceparent`
            await c.add_memory("Ships orders on Tuesdays", wait=True)
    spans = await spans_until(otlp, trace_id, "POST /v1/memory", "ledger ", "memory-index memlane.memory.events")
    chained(spans, root)
    [served] = [s for s in spans if s.name.startswith("POST ")]
    assert served.parent_id == root and served.service == "memlane-api"
    assert served.attributes["http.response.status_code"] in (200, 201)
    child(spans, "ledger ", "POST ")
    assert "Tuesdays" not in " ".join(f"{s.name} {s.attributes}" for s in spans)
