"""A rebuild's fill: `apply` for a generation that this process alone fills, in log order, for
the agents it folds. It knows every record's current version itself (`FillMemo`), so it sends
plain commands, one HSET per agent for the batch's versions: no script, whose interpreter cost
redis-server more than the writes."""

from __future__ import annotations

from typing import Any

from events.lean import LeanEvent
from projections.redis.record_view_fold import FoldBatch, FoldView, Row, checkpoints, fold
from projections.redis.record_view_keys import agent_key, user_list_key


class FillMemo:
    """What this process's fill wrote: each record's current version by (agent hash, record id)
    and each usage total by (usage hash, record id). A purge forgets what it drops."""

    def __init__(self) -> None:
        self.versions: dict[tuple[str, str], int] = {}
        self.usage: dict[tuple[str, str], int] = {}

    def forget_agent(self, rk: str, uk: str) -> None:
        self.versions = {k: v for k, v in self.versions.items() if k[0] != rk}
        self.usage = {k: v for k, v in self.usage.items() if k[0] != uk}

    def forget_records(self, rk: str, uk: str, rids: list[str]) -> None:
        for rid in rids:
            self.versions.pop((rk, rid), None)
            self.usage.pop((uk, rid), None)


class FillBatch(FoldBatch):
    """A segment's fill: versions, sorted-set changes and members are gathered per key, so each
    key takes one command for the batch."""

    def __init__(self, view: FoldView, pipe: Any, ns: str, memo: FillMemo) -> None:
        super().__init__(view, pipe, ns)
        self.memo = memo
        self.versions: dict[str, list[Any]] = {}  # agent hash -> field, value, ...
        self.changes: dict[str, dict[str, float | None]] = {}  # sorted set -> member -> score, None to remove
        self.users: dict[str, set[str]] = {}  # the agent's set of members -> members this batch names

    def record(self, r: Row) -> None:
        ns, ak, rid, ver = self.ns, r.agent, r.rid, r.version
        rk = agent_key(ns, "rec", ak)
        if r.shadows:
            self.pipe.sadd(agent_key(ns, "shadowed", ak), r.shadows)
        if r.user:
            self.users.setdefault(agent_key(ns, "users", ak), set()).add(r.user)
        cur = self.memo.versions.get((rk, rid), 0)
        if ver <= cur:
            self.pipe.hsetnx(rk, f"{rid}#{ver}", r.raw)
            return
        self.memo.versions[rk, rid] = ver
        self.versions.setdefault(rk, []).extend((f"{rid}#{ver}", r.raw, rid, ver))
        later = cur > 0  # a first version has no earlier listing, pin or expiry to take back
        zsets = [
            (agent_key(ns, "list", ak), r.flags & 1, r.score),
            (agent_key(ns, "pinned", ak), r.flags & 2, r.score),
            (agent_key(ns, "expiry", ak), r.expiry != -1, r.expiry),
        ]
        if r.user:
            zsets.append((user_list_key(ns, ak, r.user), r.flags & 1, r.score))
        for key, on, value in zsets:
            if on or later:
                self.changes.setdefault(key, {})[rid] = value if on else None

    def queue_gathered(self) -> None:
        """The gathered writes, after what the fold queued: versions, then the sorted sets and
        the members that name them, then the usage totals that grew."""
        for rk, fields in self.versions.items():
            self.pipe.execute_command("HSET", rk, *fields)
        for key, members in self.changes.items():
            if add := {m: v for m, v in members.items() if v is not None}:
                self.pipe.zadd(key, add)
            if rem := [m for m, v in members.items() if v is None]:
                self.pipe.zrem(key, *rem)
        for key, names in self.users.items():
            self.pipe.sadd(key, *names)
        for ak, totals in self.used.items():
            # USAGE's guard, from the totals this process wrote: plain HSETs of those that grew.
            uk = agent_key(self.ns, "usage", ak)
            grew = {rid: n for rid, n in totals.items() if n > self.memo.usage.get((uk, rid), 0)}
            if grew:
                self.memo.usage.update({(uk, rid): n for rid, n in grew.items()})
                self.pipe.hset(uk, mapping=grew)


class FillWrites:
    """A rebuild's writes: a segment folded into plain commands, then its checkpoint."""

    def __init__(self, view: FoldView, memo: FillMemo) -> None:
        self.view = view
        self.memo = memo

    async def segment(self, ns: str, events: list[LeanEvent], gone: set[str],
                      positions: list[tuple[str, int]] | None) -> None:
        """The view's writes, then the checkpoint, so it never gets ahead of the view; a
        rebuild that fails starts a new generation anyway."""
        batch = FillBatch(self.view, self.view.r.pipeline(transaction=False), ns, self.memo)
        await fold(batch, events, gone)
        batch.queue_gathered()
        await batch.send()
        # After the view's writes, which on a cluster go to several nodes at once.
        if ckpt := checkpoints(positions):
            await self.view.r.hset(f"{ns}:ckpt", mapping=ckpt)
