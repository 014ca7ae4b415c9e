"""A LangGraph `BaseStore` over memlane memory (`pip install 'memlane-client[langgraph]'`).

Namespaces map to whose memory an item is: `("-",)` and deeper are the agent's own records,
`(user,)` a member's facts (USER scope, sent as X-User), `(user_or_"-", "session:<id>")` a
session's (SESSION scope, X-Session). The whole namespace is kept as the record's label
`lg_ns` and the item's key as `lg_key` (the agent's `memory.labels` declares both: `LABELS`); the item's value is the record's metadata, its text the
record's summary (the value's `text`, `content` or `memory`, else its JSON), so memlane's search,
extraction rules and limits apply to it. A put to a key that holds an item replaces it (a new
version of the memory); a delete deletes the record. Refusals are memlane's `MemlaneError`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)

from memlane_client.http import MemlaneClient
from memlane_client.integrations._loop import LoopThread
from memlane_client.records import Record

NS, KEY = "lg_ns", "lg_key"
# The labels the agent's configuration declares for the store (`memory.labels`), numbered as memlane numbers labels.
LABELS = {NS: {"number": 17, "description": "LangGraph namespace"}, KEY: {"number": 18, "description": "LangGraph key"}}
PAGE = 100


def whose(namespace: tuple[str, ...]) -> tuple[str | None, str | None, str]:
    """(member, session, scope) of a namespace."""
    user = namespace[0] if namespace and namespace[0] != "-" else None
    session = namespace[1][len("session:"):] if len(namespace) > 1 and namespace[1].startswith("session:") else None
    scope = "USER" if user else "SESSION" if session else "AGENT"
    return user, session, scope


def text_of(value: Mapping[str, Any]) -> str:
    for field in ("text", "content", "memory"):
        if isinstance(value.get(field), str) and value[field].strip():
            return value[field]
    return json.dumps(value, sort_keys=True)


class MemlaneStore(BaseStore):
    """`MemlaneStore(api_url, key)`: an agent key's memory as LangGraph's long-term store."""

    def __init__(self, api_url: str | list[str], key: str) -> None:
        self.api_url, self.key = api_url, key
        self._clients: dict[tuple[str | None, str | None], MemlaneClient] = {}
        self._sync: tuple[LoopThread, MemlaneStore] | None = None  # the synchronous calls' loop and store

    def _client(self, user: str | None, session: str | None) -> MemlaneClient:
        c = self._clients.get((user, session))
        if c is None:
            c = self._clients[(user, session)] = MemlaneClient(self.api_url, self.key, user=user, session=session)
        return c

    # ---------------------------------------------------------------- BaseStore

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        if self._sync is None:
            self._sync = (LoopThread(), MemlaneStore(self.api_url, self.key))
        loop, store = self._sync
        return loop.run(store.abatch(list(ops)))

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        out: list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                out.append(await self._get(op.namespace, op.key))
            elif isinstance(op, PutOp):
                await self._put(op)
                out.append(None)
            elif isinstance(op, SearchOp):
                out.append(await self._search(op))
            elif isinstance(op, ListNamespacesOp):
                out.append(await self._namespaces(op))
            else:
                raise TypeError(f"op: {type(op).__name__} is not a store operation this store takes")
        return out

    async def aclose(self) -> None:
        for c in self._clients.values():
            await c.aclose()
        if self._sync is not None:
            loop, store = self._sync
            loop.run(store.aclose())
            loop.close()

    # ---------------------------------------------------------------- operations

    async def _record(self, namespace: tuple[str, ...], key: str) -> Record | None:
        user, session, _ = whose(namespace)
        found, _ = await self._client(user, session).search_memory(
            None, labels={NS: "/".join(namespace), KEY: key}, limit=1)
        return found[0].record if found else None

    async def _get(self, namespace: tuple[str, ...], key: str) -> Item | None:
        r = await self._record(namespace, key)
        return None if r is None else Item(**_item(r))

    async def _put(self, op: PutOp) -> None:
        user, session, scope = whose(op.namespace)
        c = self._client(user, session)
        old = await self._record(op.namespace, op.key)
        if op.value is None:
            if old is not None:
                await c.delete_memory(old.id)
            return
        labels = {NS: "/".join(op.namespace), KEY: op.key}
        await c.add_memory(text_of(op.value), scope=scope, labels=labels, metadata={"value": dict(op.value)},
                           replaces=old.id if old is not None else None)

    async def _search(self, op: SearchOp) -> list[SearchItem]:
        user, session, _ = whose(op.namespace_prefix)
        prefix = "/".join(op.namespace_prefix)
        c = self._client(user, session)
        want = op.offset + op.limit
        items: list[SearchItem] = []
        after: str | None = None
        while len(items) < want:
            found, after = await c.search_memory(op.query, limit=PAGE, after=None if op.query else after)
            for f in found:
                ns = f.record.labels.get(NS)
                if ns is not None and (ns == prefix or ns.startswith(prefix + "/") or not prefix) \
                        and _matches(f.record, op.filter):
                    items.append(SearchItem(**_item(f.record), score=f.score))
            if op.query or not after:
                break
        return items[op.offset:want]

    async def _namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        seen: set[tuple[str, ...]] = set()
        after: str | None = None
        c = self._client(None, None)
        while True:
            found, after = await c.search_memory(None, limit=PAGE, after=after)
            seen.update(tuple(f.record.labels[NS].split("/")) for f in found if NS in f.record.labels)
            if not after:
                break
        out = sorted(ns[:op.max_depth] if op.max_depth else ns for ns in seen if _namespace_matches(ns, op))
        return list(dict.fromkeys(out))[op.offset:op.offset + op.limit]


def _item(r: Record) -> dict[str, Any]:
    created: datetime = r.created
    return {"namespace": tuple(r.labels[NS].split("/")), "key": r.labels[KEY],
            "value": r.metadata.get("value", {"text": r.summary}), "created_at": created, "updated_at": r.modified}


def _matches(r: Record, flt: dict[str, Any] | None) -> bool:
    value = r.metadata.get("value", {})
    return all(value.get(k) == v for k, v in (flt or {}).items())


def _namespace_matches(ns: tuple[str, ...], op: ListNamespacesOp) -> bool:
    for cond in op.match_conditions or ():
        path = tuple(cond.path)
        part = ns[:len(path)] if cond.match_type == "prefix" else ns[-len(path):]
        if len(part) != len(path) or any(p != "*" and p != q for p, q in zip(path, part, strict=True)):
            return False
    return True
