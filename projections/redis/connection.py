"""How every memlane process uses Redis: one server, or a Redis Cluster.

`MEMLANE_REDIS_CLUSTER=1` makes the composition root's `Connect` open a
`redis.asyncio.cluster.RedisCluster` (REDIS_URL then names any one node; the client learns the rest).
On a cluster every multi-key command, MULTI/EXEC and script must keep its keys in one hash slot, so every
key of one agent carries the agent as a hash tag (`agent_tag`), and what spans agents
(a batch's checkpoint, a scan over agents, dropping a generation) goes through the
helpers here, which do it per slot or per primary. docs/operations/redis-cluster.md has the layout.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot as _key_slot
from redis.exceptions import NoScriptError, ResponseError


class Connect(Protocol):
    """Opens a client of the deployment's Redis (one server, or a cluster): built once by the
    composition root (`services.bootstrap.RedisAt`) and passed to whatever reads or writes Redis.
    `pooled`: a bounded pool that reconnects and retries a few times when Redis restarts under
    it (the API's and the projections' clients)."""

    def __call__(self, *, pooled: bool = False, decode_responses: bool = True, **kwargs: Any) -> Any: ...


def is_cluster(client: Any) -> bool:
    return isinstance(client, RedisCluster)


def tagged(name: str) -> str:
    """`name` as a hash tag: keys that hold it land in one slot (Redis hashes only what is
    between the first `{` and the next `}`; ids never hold braces)."""
    return "{" + name + "}"


def agent_tag(tenant_agent: str) -> str:
    """The hash tag of an agent's keys: `{tenant/agent}`."""
    return tagged(tenant_agent)


def key_slot(key: str) -> int:
    """The cluster slot of `key` (what Redis computes, hash tags included)."""
    return _key_slot(key.encode())


async def pubsub(client: Any) -> Any:
    """A PubSub of `client`. A cluster client learns its slot map on its first command, and
    its PubSub needs that map to pick a node: a fresh one is initialised first."""
    if is_cluster(client):
        await client.initialize()
    return client.pubsub()


async def scan_keys(client: Any, match: str, count: int = 1000) -> AsyncIterator[str]:
    """Every key matching `match`: on a cluster, redis-py's `scan_iter` walks each primary
    in turn, so this sees the whole key space either way."""
    async for k in client.scan_iter(match=match, count=count):
        yield k if isinstance(k, str) else k.decode()


async def scan_page(client: Any, cursor: int, match: str, count: int) -> tuple[int, list[str]]:
    """One SCAN page as an int cursor (0 to start; 0 back when done). On a cluster the
    cursor walks the primaries one after another: it is the node's own cursor times the
    number of primaries plus the node's place among them (sorted by name), so a caller
    that keeps an int, as the reconciler does, pages a cluster the way it pages one server.
    A topology change mid-walk may skip or repeat keys, as a rehash does on one server."""
    if not is_cluster(client):
        nxt, keys = await client.scan(cursor, match=match, count=count)
        return int(nxt), [k if isinstance(k, str) else k.decode() for k in keys]
    nodes = sorted(client.get_primaries(), key=lambda n: n.name)
    at, node_cursor = cursor % len(nodes), cursor // len(nodes)
    cursors, keys = await client.scan(node_cursor, match=match, count=count, target_nodes=nodes[at])
    nxt = int(cursors[nodes[at].name])
    if nxt == 0:
        at += 1
        if at == len(nodes):
            return 0, keys
    return nxt * len(nodes) + at, keys


async def unlink_keys(client: Any, keys: list[str], page: int = 1000) -> int:
    """UNLINKs `keys` a page at a time; on a cluster one UNLINK per slot, pipelined (one
    command's keys must share a slot there)."""
    if not keys:
        return 0
    if not is_cluster(client):
        for i in range(0, len(keys), page):
            await client.unlink(*keys[i:i + page])
        return len(keys)
    by_slot: dict[int, list[str]] = {}
    for k in keys:
        by_slot.setdefault(key_slot(k), []).append(k)
    pipe = client.pipeline(transaction=False)
    for group in by_slot.values():
        for i in range(0, len(group), page):
            # Not pipe.unlink(): on redis-py's cluster pipeline it is a coroutine, and one key only.
            pipe.execute_command("UNLINK", *group[i:i + page])
    await pipe.execute()
    return len(keys)


async def retag_once(client: Any, marker: str, match: str, retag: Callable[[str], str | None]) -> int:
    """Moves the keys of the layout before hash tags to their tagged names, once: on one
    server, RENAMENX each key matching `match` that `retag` names anew (None: leave it), then
    set `marker`, so later starts cost one EXISTS. For what `memlane rebuild` cannot make
    again (session history past the turns' retention, recall counts). A cluster is skipped:
    it never held the old layout (nothing moves keys there but this), and RENAME may not
    cross slots there. Several processes may run it at once: a key another one moved is
    skipped. Returns how many keys this call moved."""
    if is_cluster(client) or await client.exists(marker):
        return 0
    moved = 0
    async for k in scan_keys(client, match, count=1000):
        new = retag(k)
        if new is None or new == k:
            continue
        try:
            moved += bool(await client.renamenx(k, new))
        except ResponseError:  # gone: another process moved it first
            continue
    await client.set(marker, "1")
    return moved


async def write_then(client: Any, writes: Callable[[Any], None], then: Callable[[Any], None] | None = None,
                     scripts: tuple[Any, ...] = ()) -> None:
    """`writes(pipe)` and `then(pipe)` (a checkpoint, say) in one MULTI/EXEC on one server.
    On a cluster a transaction may not span slots, so the writes go out pipelined (each
    agent's keys on its own node, in order) and `then` only after every one succeeded: the
    checkpoint never gets ahead of the view, and a crash in between replays writes that
    are idempotent (versioned, sets, HyperLogLogs). `scripts`: the registered scripts the
    pipes call by EVALSHA, loaded where they are missing."""
    if not is_cluster(client):
        async with client.pipeline(transaction=True) as p:
            p.scripts.update(scripts)  # redis-py loads the missing ones before MULTI
            writes(p)
            if then is not None:
                then(p)
            await p.execute()
        return
    for step in (writes, then):
        if step is None:
            continue
        p = client.pipeline(transaction=False)
        step(p)
        if not len(p):
            continue
        try:
            await p.execute()
        except NoScriptError:
            # A node that restarted (or a first call) lacks a script: SCRIPT LOAD goes to
            # every primary, and the step runs again, which its idempotence allows.
            for s in scripts:
                await client.script_load(s.script)
            p = client.pipeline(transaction=False)
            step(p)
            await p.execute()
