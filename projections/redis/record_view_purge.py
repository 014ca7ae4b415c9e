"""Erasures and purges in the record view: `SubjectErased` and `RecordsPurged` drop what they
name from a generation, with whatever the narrow views keep of it. Idempotent: a replay drops
nothing more."""

from __future__ import annotations

from typing import Any

from events.lean import as_lean
from events.record import Scope
from projections.records import Erasure
from projections.redis import note_view, profile_view, run_view, shared_view
from projections.redis.connection import unlink_keys
from projections.redis.record_view_fill import FillMemo
from projections.redis.record_view_keys import (
    AGENT_KINDS,
    PAGE,
    REMOVED_TENANTS,
    agent_key,
    tagged_agents,
    user_list_key,
)
from projections.redis.record_view_stored import lean_record
from projections.redis.view_store import ViewStore


class Purger:
    """Drops from the view that `view` reads through; what a fill remembered of it goes too."""

    def __init__(self, view: ViewStore, memo: FillMemo) -> None:
        self.view = view
        self.memo = memo

    @property
    def r(self) -> Any:
        return self.view.r

    async def purge(self, ns: str, e: Any) -> None:
        """Drops what a `SubjectErased` or a `RecordsPurged` names from generation namespace `ns`."""
        e = as_lean(e, self.view.codec)
        if e.type == "RecordsPurged":
            await self._drop_records(ns, f"{e.tenant}/{e.agent}", set(e.record_ids))
            return
        er = Erasure.of(e)
        await note_view.purge(self.r, ns, er)  # notes go with their member, or with their agent
        if er.agent is None and er.user is None:  # the whole tenant: its conventions and floors too
            await shared_view.purge_tenant(self.r, ns, er.tenant)
            await self.r.sadd(f"{ns}:{REMOVED_TENANTS}", er.tenant)  # removed until restored
        agents = [er.agent] if er.agent is not None else await self._agents_of(ns, er.tenant)
        for agent in agents:
            ak = f"{er.tenant}/{agent}"
            await run_view.purge(self.view, ns, er.tenant, agent, er.user)
            if er.user is None:
                await self._drop_agent(ns, ak)
            else:
                await self._drop_member(ns, ak, er.user)

    async def _agents_of(self, ns: str, tenant: str) -> set[str]:
        """The agents of `tenant` the view holds anything of."""
        agents = set()
        for kind in ("rec", "blocks", "consent", profile_view.PROFILE_KIND):
            agents |= await tagged_agents(self.r, ns, kind, tenant)
        return agents

    async def _drop_agent(self, ns: str, ak: str) -> None:
        """Everything of an agent but its configuration (no personal data; the log holds it in
        the clear): its keys, one slot, and its member listings, named by its set of members."""
        members = await self.r.smembers(agent_key(ns, "users", ak))
        keys = [agent_key(ns, kind, ak) for kind in AGENT_KINDS] + [user_list_key(ns, ak, u) for u in sorted(members)]
        await unlink_keys(self.r, keys, PAGE)
        await self.r.srem(f"{ns}:expiring", ak)
        self.memo.forget_agent(agent_key(ns, "rec", ak), agent_key(ns, "usage", ak))

    async def _drop_member(self, ns: str, ak: str, user: str) -> None:
        """Every version of the records that name the member on the agent (their USER records
        and what else was made from their turns), their listing, their consent and their place
        among the agent's members. Walks the agent's versions (a deleted or superseded record
        is in no listing): an erasure is rare."""
        rk = agent_key(ns, "rec", ak)
        rids: set[str] = set()
        fields: list[str] = []
        needle = f'"user":"{user}"'
        async for field, raw in self.r.hscan_iter(rk, match="*#*", count=PAGE):
            if needle not in raw:
                continue
            r = lean_record(raw)
            if r is not None and r.user == user:  # theirs in any scope: made from their turn
                rids.add(field.partition("#")[0])
                fields.append(field)
        await self._drop_records(ns, ak, rids, fields, {user})
        pipe = self.r.pipeline(transaction=False)
        pipe.execute_command("UNLINK", user_list_key(ns, ak, user))  # cluster pipelines make unlink() a coroutine
        pipe.srem(agent_key(ns, "users", ak), user)
        pipe.hdel(agent_key(ns, "consent", ak), user)
        pipe.hdel(agent_key(ns, profile_view.PROFILE_KIND, ak), user)  # the member's profile
        await pipe.execute()

    async def _drop_records(self, ns: str, ak: str, rids: set[str], fields: list[str] | None = None,
                            users: set[str] | None = None) -> None:
        """Every version of `rids` (`fields`, their versions, when the caller found them) and
        their places in the agent's listings."""
        if not rids:
            return
        rk, ids = agent_key(ns, "rec", ak), sorted(rids)
        if fields is None:
            fields, users = await self._versions_and_members(rk, ids, users)
        pipe = self.r.pipeline(transaction=False)
        doomed = ids + fields
        for i in range(0, len(doomed), PAGE):
            pipe.hdel(rk, *doomed[i:i + PAGE])
        for i in range(0, len(ids), PAGE):
            chunk = ids[i:i + PAGE]
            for kind in ("list", "pinned", "expiry"):
                pipe.zrem(agent_key(ns, kind, ak), *chunk)
            pipe.srem(agent_key(ns, "shadowed", ak), *chunk)
            pipe.hdel(agent_key(ns, "usage", ak), *chunk)
            for user in users or ():
                pipe.zrem(user_list_key(ns, ak, user), *chunk)
        await pipe.execute()
        self.memo.forget_records(rk, agent_key(ns, "usage", ak), ids)

    async def _versions_and_members(self, rk: str, ids: list[str],
                                    users: set[str] | None) -> tuple[list[str], set[str]]:
        """Every version field of `ids`, and the members whose listings hold them (`users` and
        those of their USER records)."""
        currents = await self.r.hmget(rk, ids)
        fields = [f"{rid}#{v}" for rid, cur in zip(ids, currents) if cur for v in range(1, int(cur) + 1)]
        members = set(users or ())
        latest = [f"{rid}#{cur}" for rid, cur in zip(ids, currents) if cur]
        for raw in await self.r.hmget(rk, latest) if latest else []:
            r = lean_record(raw) if raw else None
            if r is not None and r.scope is Scope.USER and r.user:
                members.add(r.user)
        return fields, members
