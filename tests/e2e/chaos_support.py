"""Kill -9 one process of a running stack during a write burst, and count what was lost.

Shared by the chaos test and `make bench ONLY=chaos`. A write is acknowledged when the API
answered 201 (HTTP, `wait=false`: the command is in the log) or when the broker acknowledged
a turn carrying an `add_memory` call. Afterwards every acknowledged write must be readable
exactly once and found by a lexical search for its unique token, and every acknowledged
turn's message must be found in session history.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from dataclasses import dataclass, field

import httpx
from aiokafka.admin import AIOKafkaAdminClient

from events import Message, ToolCall
from services.client import TurnPublisher
from services.stack import Stack
from tests.conftest import eventually
from tests.e2e.extraction_support import turn

# Processes a chaos round can kill; `api` also holds the Qdrant and history projections.
VICTIMS = ("api", "ledger", "redis-projection", "embedding", "extraction", "history")
_LETTERS = str.maketrans("0123456789", "ghijklmnop")
PER_AGENT = 150
WRITERS = 8  # concurrent HTTP writers: enough to keep events waiting for their vectors at any moment  # under the 200-live-record cap, so no acknowledged write is refused


@dataclass
class Agent:
    tenant: str
    agent: str
    key: str


@dataclass
class ChaosResult:
    victim: str
    writes_acked: int = 0
    turns_acked: int = 0
    lost: list[str] = field(default_factory=list)  # acknowledged, never readable
    duplicated: list[str] = field(default_factory=list)  # readable more than once
    unsearchable: list[str] = field(default_factory=list)  # readable, not found by search
    history_missing: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def acked(self) -> int:
        return self.writes_acked + self.turns_acked


async def _agents(api_url: str, operator_key: str, n: int) -> list[Agent]:
    out = []
    async with httpx.AsyncClient(base_url=api_url, timeout=30) as http:
        for _ in range(n):
            tenant, agent = f"chaos{uuid.uuid4().hex[:6]}", f"agent{uuid.uuid4().hex[:6]}"
            r = await http.post("/v1/admin/keys", json={"tenant": tenant, "agent": agent},
                                headers={"Authorization": f"Bearer {operator_key}"})
            r.raise_for_status()
            out.append(Agent(tenant, agent, r.json()["key"]))
            # Agent scope: every record is readable and searchable without naming its session.
            r = await http.put("/v1/config", json={"memory": {"scope": {"read": ["agent"], "write": ["agent"]}}, "history": {"index": "messages"}},
                               headers={"Authorization": f"Bearer {operator_key}", "X-Tenant": tenant,
                                        "X-Agent": agent})
            r.raise_for_status()
    return out


async def _http_writer(api_url: str, a: Agent, tokens: list[str], acked: list[tuple[Agent, str]],
                       deadline: float) -> None:
    """Writes each token's record, retrying with the same command id until the API
    acknowledges it (a retry after a lost answer must not make a second record)."""
    async with httpx.AsyncClient(base_url=api_url, timeout=10,
                                 headers={"Authorization": f"Bearer {a.key}"}) as http:
        for tok in tokens:
            body = {"summary": f"chaos record {tok}", "scope": "AGENT", "command_id": f"chaos-{tok}"}
            while time.monotonic() < deadline:
                try:
                    r = await http.post("/v1/memory", params={"wait": "false"}, json=body)
                    if r.status_code == 201:
                        acked.append((a, tok))
                        break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.2)


async def _turn_writer(publisher: TurnPublisher, a: Agent, tokens: list[str], acked: list[tuple[Agent, str]]) -> None:
    for n, tok in enumerate(tokens):
        session = f"s{tok[:8]}"
        call = ToolCall(id=f"call-{tok}", name="add_memory", arguments={"summary": f"chaos turn record {tok}",
                                                                                 "scope": "AGENT"})
        t = turn(a.tenant, a.agent, session, n, messages=[
            Message(id=f"{tok}-u", role="user", content=f"please remember {tok}"),
            Message(id=f"{tok}-a", role="assistant", content="noted", tool_calls=[call]),
        ])
        await publisher.publish(t)
        acked.append((a, tok))


async def _listed(api_url: str, a: Agent) -> dict[str, list[dict]]:
    """The agent's records by summary token, every page."""
    by_token: dict[str, list[dict]] = {}
    async with httpx.AsyncClient(base_url=api_url, timeout=30, headers={"Authorization": f"Bearer {a.key}"}) as http:
        after = None
        while True:
            r = await http.get("/v1/memory", params={"first": 200, **({"after": after} if after else {})})
            r.raise_for_status()
            data = r.json()
            for rec in data["records"]:
                by_token.setdefault(rec["summary"].rsplit(" ", 1)[-1], []).append(rec)
            after = data["next_cursor"]
            if not after:
                return by_token


async def _post(http: httpx.AsyncClient, path: str, body: dict, **kw) -> httpx.Response | None:
    """None for a connection the server dropped: a pooled one it closed after its keep-alive
    timeout while the check waited (the next round asks again)."""
    try:
        return await http.post(path, json=body, **kw)
    except httpx.TransportError:
        return None


async def _found(http: httpx.AsyncClient, tok: str, rid: str) -> bool:
    r = await _post(http, "/v1/memory/search", {"query": tok, "mode": "lexical", "limit": 5})
    return r is not None and r.status_code == 200 and rid in {x["id"] for x in r.json()["records"]}


async def _in_history(http: httpx.AsyncClient, tok: str) -> bool:
    r = await _post(http, "/v1/history/search", {"query": tok, "mode": "lexical", "limit": 5},
                    headers={"X-Session": f"s{tok[:8]}"})
    return r is not None and r.status_code == 200 and any(e["id"] == f"{tok}-u" for e in r.json()["events"])


async def _joined(bootstrap: str, group: str, timeout: float = 60) -> None:
    """Waits until the consumer group is stable and every member of it holds partitions."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        async def stable() -> bool:
            [resp] = await admin.describe_consumer_groups([group])
            [g] = resp.groups
            state, members = g[2], g[5]
            return state == "Stable" and bool(members) and all(m[4] for m in members)

        await eventually(stable, timeout=timeout, interval=0.2)
    finally:
        await admin.close()


async def settle(check, items: list, timeout: float) -> list:
    """The items `check` still refuses once `timeout` has passed (checked in rounds)."""
    left, deadline = list(items), time.monotonic() + timeout
    gate = asyncio.Semaphore(16)  # as many requests at once as a few agents would send

    async def one(x) -> bool:
        async with gate:
            return await check(x)

    while left and time.monotonic() < deadline:
        oks = await asyncio.gather(*(one(x) for x in left))
        left = [x for x, ok in zip(left, oks) if not ok]
        if left:
            await asyncio.sleep(0.5)
    return left


async def chaos_round(stack: Stack, operator_key: str, bootstrap: str, topic_prefix: str, victim: str,
                      writes: int = 120, turns: int = 40, kill_after: float = 0.3,
                      settle_s: float = 90.0, progress=None, fault: str | None = None) -> ChaosResult:
    """One burst of `writes` HTTP writes and `turns` turns; `victim` is killed (SIGKILL)
    once `kill_after` of the HTTP writes are acknowledged, and started again. With `fault` (a
    MEMLANE_FAULT_AT value, workers.runtime.faults) the victim is started again before the burst with
    that fault point, and kills itself there instead."""
    res, t0 = ChaosResult(victim), time.monotonic()
    n_agents = max(1, -(-(writes + turns) // PER_AGENT))
    agents = await _agents(stack.api_url, operator_key, n_agents)
    if fault:  # after the agents are configured: the point is to be reached during the burst
        stack.kill(victim, signal.SIGTERM)
        stack.start(victim, MEMLANE_FAULT_AT=fault)
        if victim == "api":
            await asyncio.to_thread(stack.wait_healthy, 120)
        else:  # in its group with partitions, so the burst's batches are its to commit
            await _joined(bootstrap, f"{stack.env.get('MEMLANE_GROUP_PREFIX', 'memlane')}.{topic_prefix}{victim}")
    # Letters only: a long run of digits can pass for a card number, which the write filter refuses.
    tokens = [uuid.uuid4().hex.translate(_LETTERS) for _ in range(writes + turns)]
    http_acked: list[tuple[Agent, str]] = []
    turn_acked: list[tuple[Agent, str]] = []
    deadline = time.monotonic() + 120
    per = -(-writes // WRITERS)
    http_jobs = [tokens[i:min(i + per, writes)] for i in range(0, writes, per)]
    turn_toks = tokens[writes:]
    async with TurnPublisher(bootstrap, topic_prefix) as publisher:
        tasks = [asyncio.create_task(_http_writer(stack.api_url, agents[i % n_agents], job, http_acked, deadline))
                 for i, job in enumerate(http_jobs)]
        tasks += [asyncio.create_task(_turn_writer(publisher, agents[i % n_agents], turn_toks[i::n_agents],
                                                   turn_acked)) for i in range(n_agents)]
        burst = asyncio.gather(*tasks)
        if fault:
            proc = stack.procs[victim]
            # Whichever ends first: the victim (at its point) or the burst (the point never reached).
            died = asyncio.ensure_future(asyncio.to_thread(proc.wait))
            await asyncio.wait({died, burst}, return_when=asyncio.FIRST_COMPLETED)
            if not died.done():
                # Never reached: started again without the point, so no later test meets it.
                stack.kill(victim, signal.SIGTERM)
                stack.start(victim)
                await burst
                raise AssertionError(f"{victim} never reached its fault point {fault} during the burst")
            assert proc.returncode == -signal.SIGKILL, f"{victim} exited with {proc.returncode}, not at its fault point"
            del stack.procs[victim]
        else:
            await eventually(lambda: len(http_acked) >= kill_after * writes or burst.done(), timeout=180, interval=0.05)
            stack.kill(victim)
        if progress:
            progress(f"chaos {victim}: killed after {len(http_acked)} acknowledged writes")
        stack.start(victim)
        if victim == "api":
            await asyncio.to_thread(stack.wait_healthy, 120)
        await burst
    res.writes_acked, res.turns_acked = len(http_acked), len(turn_acked)
    acked = http_acked + turn_acked

    # Listing is per agent: refresh every agent's listing, then see which tokens are there.
    listed: dict[str, dict[str, list[dict]]] = {}
    left, end = acked, time.monotonic() + settle_s
    while True:
        for a in agents:
            try:
                listed[a.agent] = await _listed(stack.api_url, a)
            except httpx.HTTPError:
                listed[a.agent] = listed.get(a.agent, {})
        left = [(a, tok) for a, tok in acked if tok not in listed[a.agent]]
        if not left or time.monotonic() > end:
            break
        await asyncio.sleep(1)
    res.lost = [tok for _, tok in left]
    res.duplicated = [tok for a, tok in acked if len(listed[a.agent].get(tok, [])) > 1]
    clients = {a.agent: httpx.AsyncClient(base_url=stack.api_url, timeout=30,
                                          headers={"Authorization": f"Bearer {a.key}"}) for a in agents}
    try:
        present = [(a, tok) for a, tok in acked if tok in listed[a.agent]]

        async def searchable(item):
            a, tok = item
            return await _found(clients[a.agent], tok, listed[a.agent][tok][0]["id"])

        res.unsearchable = [tok for _, tok in await settle(searchable, present, settle_s / 2)]

        async def in_history(item):
            return await _in_history(clients[item[0].agent], item[1])

        res.history_missing = [tok for _, tok in await settle(in_history, turn_acked, settle_s / 2)]
    finally:
        for c in clients.values():
            await c.aclose()
    res.seconds = time.monotonic() - t0
    return res
