"""Redis adapter of the activity view: per-minute counts of turns, extraction decisions and
recalls, and each record's recalls (what is counted: events.rules.activity; docs/features/activity.md).

Under the deployment's root (`settings.redis_root`), ids, counts and times only:
- `act:<scope>:<minute>:<kind>`: a set of the ids (8-byte digests) counted in that minute, for the scopes
  `{<tenant>/<agent>}` (the agent as hash tag: its keys share a Redis Cluster slot), `<tenant>` and
  `*` (every tenant). Sets, not counters: adding an id twice
  changes nothing, so replays, redeliveries and several API processes following the same
  topics count each thing once. Each expires `KEEP_MINUTES` after its minute.
- `act:rc:{<tenant>/<agent>}/<record>`: a HyperLogLog of the recalls' usage ids that named the
  record (idempotent like a set, at most 12 kB however often it is recalled; exact in
  practice for small counts, within about 1% beyond), and `act:rf:` / `act:rl:{<tenant>/<agent>}`:
  sorted sets of each record's first and last recall (ZADD LT / GT: idempotent too).
- `act:ckpt`: the follower's next offset per partition, written in the same MULTI/EXEC as
  the counts it covers (on a Redis Cluster right after them, which every write above allows:
  adding what is there changes nothing).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import redis.asyncio as aioredis

from events.rules.activity import KEEP_MINUTES, KINDS, Recalled, Tick
from projections.redis.connection import agent_tag, retag_once, write_then


def _iso(ms: float | None) -> str | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def _digest(member: str) -> bytes:
    # 8 bytes instead of a ~50-character id halves a set's memory; two ids of one minute
    # colliding is a 1 in 2**64 chance per pair.
    return hashlib.blake2b(member.encode(), digest_size=8).digest()


class ActivityView:
    def __init__(self, client: aioredis.Redis, root: str) -> None:
        self.r = client  # decode_responses=True
        self.root = f"{root}act:"
        self._retagged = False

    async def aclose(self) -> None:
        await self.r.aclose()

    def _minute_key(self, scope: str, minute: int, kind: str) -> str:
        # An agent's scope is its hash tag; a tenant's and every tenant's spread over the slots.
        return f"{self.root}{agent_tag(scope) if '/' in scope else scope}:{minute}:{kind}"

    @property
    def _ckpt(self) -> str:
        return f"{self.root}ckpt"

    # ------------------------------------------------------------------ write side

    async def apply(self, ticks: Iterable[Tick], recalls: Iterable[Recalled], positions: Mapping[str, int]) -> None:
        """Adds a batch's counts and moves the checkpoint, in one MULTI/EXEC."""
        # One SADD per key of the batch, not per id: the commands, not Redis, were the cost.
        members: dict[str, list[bytes]] = {}
        expiring: dict[str, int] = {}
        for t in ticks:
            for scope in (f"{t.tenant}/{t.agent}", t.tenant, "*"):
                key = self._minute_key(scope, t.minute, t.kind)
                members.setdefault(key, []).append(_digest(t.member))
                expiring[key] = (t.minute + KEEP_MINUTES + 1) * 60
        recalls = list(recalls)

        def writes(p: Any) -> None:
            for key, ids in members.items():
                p.sadd(key, *ids)
                p.expireat(key, expiring[key])
            for rc in recalls:
                agent = agent_tag(f"{rc.tenant}/{rc.agent}")
                for rid in rc.record_ids:
                    p.pfadd(f"{self.root}rc:{agent}/{rid}", rc.usage_id)
                if rc.record_ids:
                    at = dict.fromkeys(rc.record_ids, rc.at_ms)
                    p.zadd(f"{self.root}rf:{agent}", at, lt=True)
                    p.zadd(f"{self.root}rl:{agent}", at, gt=True)

        def checkpoint(p: Any) -> None:
            if positions:
                p.hset(self._ckpt, mapping=dict(positions))

        await write_then(self.r, writes, checkpoint)

    async def checkpoints(self) -> dict[str, int]:
        """The follower's checkpoints. Its first look moves recall counts kept before hash tags
        to the tagged names (`connection.retag_once`): `memlane.usage` may no longer hold
        their recalls. Per-minute counts are not moved: they expire within the hour anyway."""
        if not self._retagged:
            await retag_once(self.r, f"{self.root}layout:tagged", f"{self.root}r[cfl]:*", self._retag)
            self._retagged = True
        return {k: int(v) for k, v in (await self.r.hgetall(self._ckpt)).items()}

    def _retag(self, key: str) -> str | None:
        head, rest = key[:len(self.root) + 3], key[len(self.root) + 3:]
        if "{" in rest or head[-3:] not in ("rc:", "rf:", "rl:"):
            return None
        tenant, _, rest = rest.partition("/")
        agent, slash, rid = rest.partition("/")
        if not agent or (head.endswith("rc:") != bool(slash)):
            return None
        return f"{head}{agent_tag(f'{tenant}/{agent}')}{slash}{rid}"

    # ------------------------------------------------------------------ read side

    async def series(self, tenant: str | None, agent: str | None, minutes: int = 60,
                     now: datetime | None = None) -> dict[str, list[Any]]:
        """Per minute, oldest first, ending with the current one: turns, extraction decisions
        (added, superseded, deleted, refused) and recalls. `tenant` None: every tenant."""
        if tenant is None and agent is not None:
            raise ValueError("an agent is named with its tenant")
        minutes = max(1, min(minutes, KEEP_MINUTES))
        scope = "*" if tenant is None else (tenant if agent is None else f"{tenant}/{agent}")
        last = int((now or datetime.now(UTC)).timestamp() // 60)
        span = range(last - minutes + 1, last + 1)
        async with self.r.pipeline(transaction=False) as p:
            for m in span:
                for kind in KINDS:
                    p.scard(self._minute_key(scope, m, kind))
            counts = await p.execute()
        out: dict[str, list[Any]] = {"minutes": [_iso(m * 60_000) for m in span]}
        for i, kind in enumerate(KINDS):
            out[kind] = counts[i::len(KINDS)]
        return out

    async def recalls_of(self, tenant: str, agent: str, record_ids: list[str]) -> dict[str, dict[str, Any]]:
        """Per record id: how many recalls named it (any version), and the first and last
        one's time; `{"count": 0, "first": None, "last": None}` for a record never recalled."""
        ids = list(dict.fromkeys(record_ids))
        if not ids:
            return {}
        scope = agent_tag(f"{tenant}/{agent}")
        async with self.r.pipeline(transaction=False) as p:
            for rid in ids:
                # execute_command: redis-py's cluster pipeline refuses pfcount() (which may name several keys).
                p.execute_command("PFCOUNT", f"{self.root}rc:{scope}/{rid}")
            p.zmscore(f"{self.root}rf:{scope}", ids)
            p.zmscore(f"{self.root}rl:{scope}", ids)
            *counts, first, last = await p.execute()
        return {
            rid: {"count": n, "first": _iso(f), "last": _iso(la)} for rid, n, f, la in zip(ids, counts, first, last)
        }
