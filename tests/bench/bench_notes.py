"""notes: what re-checking notes' sources costs a recall (docs/features/notes.md).

One agent with history on: a session of 340 kept messages, and 200 notes (the most an identity
keeps): 10 about the recall's words, each citing 32 messages (320 sources in all), and 190 about
other things, each citing one. Every recall reads all 200 notes, ranks them against its text, and
checks the 320 sources of the 10 it shows against history (one Redis round trip) before
returning them; it must return all 10, with 32 sources each, or the bench stops before printing.

`note_recall_source_check_ms_p95`: POST /v1/recall's latency, p95, with those 10 notes. Beside
it, `without_notes_ms_p95`: the same recall by a second agent with the same history and no
notes, so the difference is what the notes layer adds.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

from events import AgentConfig, Message, TurnCommitted
from events.config import HistoryConfig
from services.client import MemlaneClient, TurnPublisher
from tests.bench.common import bench_stack, figure, percentile, progress
from tests.conftest import eventually

NOTES_SHOWN = 10
SOURCES = 32
OTHER_NOTES = 190  # with the 10 shown: MAX_NOTES (events.rules.ledger.notes)
MESSAGES = NOTES_SHOWN * SOURCES + 20
RECALLS = 300
WARMUP = 30
T0 = datetime(2026, 9, 1, tzinfo=UTC)
TEXT = "what do we know about the kestrel release plan?"


def turns(tenant: str, agent: str) -> list[TurnCommitted]:
    out = []
    for n in range(MESSAGES // 2):
        msgs = [Message(id=f"m{2 * n + i}", role=("user", "assistant")[i],
                        content=f"message {2 * n + i} of the planning chat, about item {n}") for i in range(2)]
        out.append(TurnCommitted(event_id=str(uuid.uuid4()), tenant=tenant, agent=agent, session="s1", turn=n + 1,
                                 execution_id="x1", occurred_at=T0 + timedelta(seconds=n), messages=msgs))
    return out


async def _agent(stack, settings, tenant: str, agent: str) -> str:
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
        key = await op.issue_key(tenant, agent)
        await op.configure(AgentConfig(history=HistoryConfig()))
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
        await pub.publish_many(turns(tenant, agent))
    async with MemlaneClient(stack.api_url, key, session="s1") as c:
        async def kept() -> bool:
            return len((await c.search_history(ids=[f"m{MESSAGES - 1}"]))["events"]) == 1

        await eventually(kept, timeout=120)
    return key


async def _recalls(url: str, key: str) -> tuple[list[float], dict]:
    times, last = [], {}
    async with MemlaneClient(url, key, session="s1") as c:
        for i in range(WARMUP + RECALLS):
            t0 = time.perf_counter()
            last = await c.recall(f"conv{i}", TEXT)
            if i >= WARMUP:
                times.append((time.perf_counter() - t0) * 1000)
    return times, last


async def run() -> None:
    with bench_stack("notes", workers=("ledger", "redis-projection", "history")) as (stack, settings):
        key = await _agent(stack, settings, "bench", "noted")
        bare = await _agent(stack, settings, "bench", "bare")
        progress(f"{MESSAGES} messages kept for each agent; saving {NOTES_SHOWN + OTHER_NOTES} notes")
        t0 = time.perf_counter()
        async with MemlaneClient(stack.api_url, key, session="s1") as c:
            for i in range(NOTES_SHOWN):
                await c.save_note(f"kestrel-{i}", f"Kestrel release plan, part {i}",
                                  f"The kestrel release plan, step {i}: what the planning chat agreed",
                                  [f"m{SOURCES * i + j}" for j in range(SOURCES)])
            for i in range(OTHER_NOTES):
                await c.save_note(f"other-{i}", f"Item {i}", f"Lunch order number {i} for the team",
                                  [f"m{MESSAGES - 1 - i % 20}"])
        progress(f"saved {NOTES_SHOWN + OTHER_NOTES} notes in {time.perf_counter() - t0:.1f} s")
        times, last = await _recalls(stack.api_url, key)
        notes = last["notes"]
        if len(notes) != NOTES_SHOWN or any(n["sources"] != SOURCES for n in notes):
            raise AssertionError(f"the recall returned {[(n['id'], n['sources']) for n in notes]}, not "
                                 f"{NOTES_SHOWN} notes of {SOURCES} sources")
        base, bare_last = await _recalls(stack.api_url, bare)
        assert bare_last["notes"] == []
        figure("note_recall_source_check_ms_p95", percentile(times, 95), "ms", len(times),
               notes_shown=len(notes), sources_each=SOURCES, notes_held=NOTES_SHOWN + OTHER_NOTES,
               p50_ms=round(percentile(times, 50), 3), without_notes_ms_p95=round(percentile(base, 95), 3),
               without_notes_ms_p50=round(percentile(base, 50), 3))
