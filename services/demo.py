"""`make demo`: the pipeline on a short sample conversation, end to end, then stop.

It starts each worker and the API as its own process, publishes turn events to Kafka,
waits until the records can be searched, and prints what was stored and found.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.table import Table

from events import AgentConfig, Message, ToolCall, TurnCommitted, TurnRolledBack
from services.client import MemlaneClient, TurnPublisher
from services.stack import PIPELINE, Stack, stack_env
from settings import ROOT, Settings

console = Console()

# (turn, user says, memory the agent saves with add_memory, committed?)
CONVERSATION = [
    (1, "Hi! I'm Dana, I run the payments team in Lisbon.", "The user is Dana, who runs the payments team in Lisbon.", True),
    (2, "Our settlement batch ID is SETL-2291, keep it handy.", "Settlement batch ID is SETL-2291.", True),
    (3, "Actually, ignore that, I was thinking of another bank.", "Dana banks with Banco Azul.", False),
    (4, "I prefer answers as short bullet lists.", "Dana prefers short bullet-list answers.", True),
]
# (query, mode): the last one looks for the rolled-back turn's fact by its exact words.
QUERIES = [
    ("where is the user based?", "hybrid"),
    ("SETL-2291", "hybrid"),
    ("how should answers be formatted?", "hybrid"),
    ("Banco Azul", "lexical"),
]


def _turn(tenant: str, agent: str, session: str, n: int, text: str, memory: str, committed: bool):
    common: dict[str, Any] = dict(
        event_id=str(uuid.uuid4()),
        tenant=tenant,
        agent=agent,
        session=session,
        turn=n,
        execution_id=f"exec-{session}",
        occurred_at=datetime.now(UTC),
    )
    if not committed:
        return TurnRolledBack(**common, reason="the user cancelled the turn")
    call = ToolCall(id=f"call-{n}", name="add_memory", arguments={"summary": memory, "kind": "fact"})
    return TurnCommitted(
        **common,
        messages=[
            Message(id=f"m{n}u", role="user", content=text),
            Message(id=f"m{n}a", role="assistant", content="Noted.", tool_calls=[call]),
        ],
    )


async def _scenario(stack: Stack, settings: Settings) -> int:
    tenant, agent, session = "demo", "assistant", f"s-{uuid.uuid4().hex[:6]}"
    op = MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent)
    key = await op.issue_key(tenant, agent)
    await op.configure(AgentConfig())
    client = MemlaneClient(stack.api_url, key, session=session)
    t0 = time.monotonic()
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
        for n, text, memory, committed in CONVERSATION:
            await pub.publish(_turn(tenant, agent, session, n, text, memory, committed))
            mark = "[green]commit[/]" if committed else "[red]rollback[/]"
            console.print(f"turn {n} {mark}  user: {text}")
    want = sum(1 for *_, c in CONVERSATION if c)
    with console.status("waiting for the records to become searchable"):
        while True:
            found, _ = await client.search_memory(None, limit=20)
            ranked, _ = await client.search_memory(CONVERSATION[-1][2], limit=20)
            if (len(found) >= want and len(ranked) >= want) or time.monotonic() - t0 > 60:
                break
            await asyncio.sleep(0.1)
    console.print(f"\n{len(found)} records stored in {time.monotonic() - t0:.1f} s (the rolled-back turn left none)")
    table = Table("id", "summary", "scope", "source", "turn")
    for f in found:
        r = f.record.model_dump(mode="json")
        table.add_row(r["id"][:8], r["summary"], r["scope"], r["provenance"]["source"], str(r["provenance"]["turn"]))
    console.print(table)
    for q, mode in QUERIES:
        hits, _ = await client.search_memory(q, limit=1, mode=mode)
        top = f"{hits[0].record.summary}  (score {hits[0].score:.3f})" if hits else "nothing"
        console.print(f"search ({mode}) [bold]{q!r}[/] -> {top}")
    events, plain = await _log_bytes(settings, "SETL-2291")
    console.print(f"the log holds {events} memory events; 'SETL-2291' appears in plaintext in {plain} of them "
                  "(personal fields are sealed with the agent's data key; only the platform's memlane.turns is plaintext)")
    await client.aclose()
    await op.aclose()
    return 0 if len(found) == want and events and not plain else 1


async def _log_bytes(settings: Settings, text: str) -> tuple[int, int]:
    """How many messages `memlane.memory.events` holds, and how many of them hold `text` as is."""
    from aiokafka import TopicPartition

    from events.topics import EVENTS
    from workers.runtime.topic_reader import TopicReader

    async with TopicReader(settings) as c:
        msgs = await c.read_all([TopicPartition(settings.topic(EVENTS.name), p) for p in range(EVENTS.partitions)])
    return len(msgs), sum(text.encode() in (m.value or b"") for m in msgs)


def run_demo() -> int:
    run_id = f"demo{int(time.time())}"
    env = stack_env(MEMLANE_TOPIC_PREFIX=f"{run_id}.", MEMLANE_DATA_DIR=str(ROOT / ".run" / run_id))
    settings = Settings(topic_prefix=f"{run_id}.", data_dir=ROOT / ".run" / run_id)
    stack = Stack(env, ROOT / ".run" / run_id / "logs")
    t0 = time.monotonic()
    try:
        with console.status("starting the workers and the API"):
            stack.start_all(together=True)
        console.print(f"started {len(PIPELINE)} workers and the API in {time.monotonic() - t0:.1f} s (logs: {stack.log_dir})")
        return asyncio.run(_scenario(stack, settings))
    finally:
        stack.stop()
        console.print("stopped the processes the demo started")
