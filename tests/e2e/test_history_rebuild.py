"""A history rebuild embeds nothing: the embedding worker puts each history part's
vector on `memlane.history.vectors`, and the API's history projection only joins and indexes.

On the bare deployment (tests/stacks.py), first of its modules: ledger and Redis projection (the
agent's configuration), the embedding worker and the API. The fixture conversation is indexed,
searched, then the history shard and its checkpoint are deleted and the API started again: the
new process indexes every part while its embedder (metered, `memlane_embedding_*`) embeds only
its start-up warm-up text, and every search answers exactly as before.
"""

from __future__ import annotations

import re
import shutil
import signal
import uuid

import httpx

from events import AgentConfig, TurnCommitted
from events.rules.history import kept_events
from projections.qdrant.history_index import event_parts
from services.client import MemlaneClient, TurnPublisher
from tests.conftest import eventually
from tests.e2e.test_history import conversation
from workers.followers.history_qdrant import history_shard_path

QUERIES = ("When is the kestrel deployment window?", "migration runbook rollback steps", "giraffe codename",
           "who owns the runbook", "budget in euros")


def embedded_texts(api_url: str) -> float:
    """Texts the API process has embedded since it started, whoever asked (its /metrics)."""
    body = httpx.get(f"{api_url}/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(r'^memlane_embedding_texts_total\{[^}]*\} (\S+)$', body, re.M))


def searches(api_url: str, key: str) -> dict:
    out = {}
    with httpx.Client(base_url=api_url, timeout=30, headers={"Authorization": f"Bearer {key}", "X-Session": "s1"}) as h:
        for q in QUERIES:
            for mode in ("hybrid", "vector"):
                r = h.post("/v1/history/search", json={"query": q, "mode": mode, "limit": 8})
                r.raise_for_status()
                found = [(round(e["score"], 4), e["id"], e.get("part") or 0, e["parts"]) for e in r.json()["events"]]
                # Hybrid scores fuse ranks, and the parts of one message tie on keywords: which of
                # them ranks first follows insertion order, which a rebuild changes. The parts found
                # must be the same; the vector ranking, scores included, too.
                out[q, mode] = sorted(f[1:] for f in found) if mode == "hybrid" else found
    return out


def status(api_url: str) -> dict:
    return httpx.get(f"{api_url}/v1/history/status", timeout=10).json()


async def test_a_history_rebuild_embeds_nothing_and_searches_the_same(bare_stack):
    # The bare deployment, before any of its other modules: the test deletes the deployment's whole
    # history shard and checks the API process's deployment-wide counts (points, turns, parked,
    # texts embedded since start), which no tenant filter scopes; on the session stack the rebuild
    # would re-derive every other module's history too.
    stack, own = bare_stack.stack, bare_stack.settings
    prefix = own.topic_prefix
    stack.start_all(("ledger", "redis-projection", "embedding"))
    tenant, agent = f"ten{uuid.uuid4().hex[:6]}", f"agent{uuid.uuid4().hex[:6]}"
    async with MemlaneClient(stack.api_url, own.operator_key, tenant=tenant, agent=agent) as op:
        key = await op.issue_key(tenant, agent)
        await op.configure(AgentConfig.model_validate({"history": {"index": "messages_and_tools"}}))
    turns = conversation(tenant, agent)
    async with TurnPublisher(own.kafka_bootstrap, prefix) as pub:
        for t in turns:
            await pub.publish(t)
    parts = {pid for t in turns if isinstance(t, TurnCommitted) for e in kept_events(t) for pid, _ in event_parts(e)}
    assert len(parts) > len(turns)  # the long message is several parts

    def indexed():
        st = status(stack.api_url)
        return st["caught_up"] and st["points"] == len(parts) and st["parked"] == 0 and st

    await eventually(indexed, timeout=60)
    before = searches(stack.api_url, key)
    assert any(i == "u3" and parts > 1 for i, _, parts in before["migration runbook rollback steps", "hybrid"])

    # The rebuild: the API stopped, its history shard and checkpoint gone, the API started again.
    stack.kill("api", signal.SIGTERM)
    shard = history_shard_path(own)
    shutil.rmtree(shard)
    shard.parent.joinpath(f"{shard.name}.checkpoint.json").unlink()
    stack.start("api")
    stack.wait_healthy(90)
    rebuilt = await eventually(indexed, timeout=60)
    assert rebuilt["turns"] == sum(isinstance(t, TurnCommitted) for t in turns)
    # One text since the process started: the embedder's warm-up (services/http/app.py).
    # Embedding the parts again would add one per part.
    assert embedded_texts(stack.api_url) == 1
    assert searches(stack.api_url, key) == before
