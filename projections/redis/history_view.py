"""Redis side of session history: kept events by id, and each session's order.

Per session (`tenant/agent/session`): a hash of event id -> whole event, `ev:{tenant/agent}/session`,
and a sorted set ordered by turn then sequence, `ord:{tenant/agent}/session`, for listing
without a query and for paging; the agent is their hash tag, so a session's two keys share a
Redis Cluster slot. The projection's checkpoints live in the same namespace and change in the
same MULTI/EXEC as the events they cover (on a cluster, right after them:
`connection.write_then`), so a restart resumes where the view stands.
Folding the same turn twice writes the same values: replays and redeliveries are safe.

An event's text is sealed under its subject's data key (its member's when the turn had
one, else its agent's); reads open it and leave out what was sealed under a destroyed
key. An erasure (`Erasure`) drops the events it reaches and is remembered (`erased`, when
it was), so a turn folded after it, from before it, is not kept again.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import msgspec
import redis.asyncio as aioredis

from events.codec import PLAIN, Codec, ContractError
from events.rules.history import (
    SEQ_SLOTS,
    HistoryFilter,
    KeptEvent,
    Window,
    decode_change,
    encode_change,
    erased,
    erasure_marker,
    membership_erased,
    membership_windows,
    within,
)
from events.sealing import Cipher, open_text, seal_text, subject_of
from projections.records import Erasure, Keys, opening
from projections.redis.connection import agent_tag, retag_once, scan_keys, write_then

PAGE = 1000


def event_aad(session_key: str, event_id: str) -> str:
    """A sealed text is bound to its event: it cannot be moved to another."""
    return f"history:{session_key}/{event_id}"


def seal_event(e: KeptEvent, c: Cipher | None) -> str:
    """The event as stored: its text sealed by `c` (as it is without one)."""
    if c is None:
        return e.to_json()
    d = asdict(e)
    d["text"] = ""
    d["sealed"] = seal_text(c, subject_of(e.tenant, e.agent, e.user), event_aad(e.session_key, e.id), e.text)
    return json.dumps(d, separators=(",", ":"))


class _Sealed(msgspec.Struct):
    sealed: str | None = None


_STORED = msgspec.json.Decoder(KeptEvent)  # a stored event's fields; its sealed text is read apart
_TOKEN = msgspec.json.Decoder(_Sealed)


def open_event(raw: str | bytes, c: Cipher | None, text: bool = True) -> KeptEvent:
    """Raises `KeyMissing` or `KeyDestroyed` for a text it cannot open. `text=False`: the event
    without its sealed text (`text` ""), for a check of who said it and when, which needs no key
    (and costs a tenth: no decryption)."""
    e = _STORED.decode(raw)
    token = _TOKEN.decode(raw).sealed if text else None
    if token is None:
        return e
    if c is None:
        raise ContractError("sealed", "a sealed history event, and this process has no keys")
    return replace(e, text=open_text(c, event_aad(e.session_key, e.id), token))


def _tagged_session(session_key: str) -> str:
    """`tenant/agent/session` with its agent as the hash tag: `{tenant/agent}/session`."""
    tenant, _, rest = session_key.partition("/")
    agent, _, session = rest.partition("/")
    return f"{agent_tag(f'{tenant}/{agent}')}/{session}"


class RedisHistory:
    def __init__(self, client: aioredis.Redis, namespace: str = "", generation: int = 1,
                 keys: Keys | None = None, codec: Codec = PLAIN) -> None:
        self.r = client
        self.cipher = codec.cipher  # seals and opens the events' texts
        self.ns = f"ml:{namespace}hist:g{generation}"
        self.keys = keys  # catches up on keys not known yet; publishes the ones a write seals under
        self.unreadable = 0  # events left out: sealed under destroyed keys
        self._erased: dict[str, int] | None = None
        self._retagged = False

    def _ev(self, session_key: str) -> str:
        return f"{self.ns}:ev:{_tagged_session(session_key)}"

    def _ord(self, session_key: str) -> str:
        return f"{self.ns}:ord:{_tagged_session(session_key)}"

    def _mem(self, session_key: str) -> str:
        """The agent's membership changes in a session: change event id -> `ms:joined:order`."""
        return f"{self.ns}:mem:{_tagged_session(session_key)}"

    # ------------------------------------------------------------------ write side

    async def apply(self, events: list[KeptEvent], checkpoints: dict[str, int],
                    erasures: tuple[tuple[Erasure, int], ...] | list[tuple[Erasure, int]] = (),
                    memberships: list[tuple[str, str, int, bool, int]] = (),
                    deleted: list[tuple[str, str]] = ()) -> None:
        """Folds a batch: its erasures first (each with when it was, Unix ms), then its events
        and membership changes that no erasure reaches ((session key, change id, when, joined,
        order: its offset in the turns topic): keyed by change id, so folding one twice is a
        no-op), then the deleted messages ((session key, message id): a deletion follows the
        turn that said it), then the checkpoint. A crash in between folds it all again."""
        markers = await self.erasures()
        for er, at in erasures:
            await self.erase(er, at)
        kept = [e for e in events if not erased(markers, e)] if markers else events
        changes = [m for m in memberships if not membership_erased(markers, *m[0].split("/")[:2], m[2])]
        rows = [(e, seal_event(e, self.cipher)) for e in kept]
        if rows and self.keys is not None:
            await self.keys.flush()

        def writes(p) -> None:
            for e, raw in rows:
                p.hset(self._ev(e.session_key), e.id, raw)
                p.zadd(self._ord(e.session_key), {e.id: e.order})
            for sk, change_id, at, joined, order in changes:
                p.hset(self._mem(sk), change_id, encode_change(at, joined, order))
            for sk, message_id in deleted:
                p.hdel(self._ev(sk), message_id)
                p.zrem(self._ord(sk), message_id)

        def checkpoint(p) -> None:
            if checkpoints:
                p.hset(f"{self.ns}:ckpt", mapping=checkpoints)

        await write_then(self.r, writes, checkpoint)

    async def erasures(self) -> dict[str, int]:
        """Erasure marker -> when it was (Unix ms): what a late turn is checked against."""
        if self._erased is None:
            self._erased = {k: int(v) for k, v in (await self.r.hgetall(f"{self.ns}:erased")).items()}
        return self._erased

    async def erase(self, er: Erasure, at_ms: int) -> None:
        """Drops the events an erasure reaches and remembers it; an erasure of an agent or a
        tenant (no member) also drops its sessions' membership changes. Idempotent. Walks the
        keyspace for the sessions it reaches: an erasure is rare."""
        marker = erasure_marker(er.tenant, er.agent, er.user)
        markers = await self.erasures()
        if at_ms > markers.get(marker, -1):
            await self.r.hset(f"{self.ns}:erased", marker, at_ms)
            markers[marker] = at_ms
        # A session may hold membership changes and no event yet: look for both.
        sessions: list[str] = []
        for kind in ("ev",) if er.user is not None else ("ev", "mem"):
            prefix = f"{self.ns}:{kind}:"
            match = (f"{prefix}{agent_tag(f'{er.tenant}/{er.agent}')}/*" if er.agent is not None
                     else f"{prefix}{{{er.tenant}/*")
            sessions += [k[len(prefix):].replace("{", "", 1).replace("}", "", 1)
                         async for k in scan_keys(self.r, match, count=PAGE)]
        for sk in dict.fromkeys(sessions):
            if er.user is None:
                await self.r.unlink(self._ev(sk), self._ord(sk))
                # Only the changes from before it: one from after it (an agent given the name
                # again) may be folded first, the turns topic being ahead of the events'.
                doomed = [cid async for cid, raw in self.r.hscan_iter(self._mem(sk), count=PAGE)
                          if decode_change(raw)[0] <= at_ms]
                for i in range(0, len(doomed), PAGE):
                    await self.r.hdel(self._mem(sk), *doomed[i:i + PAGE])
                continue
            doomed = [eid async for eid, raw in self.r.hscan_iter(self._ev(sk), count=PAGE)
                      if json.loads(raw).get("user") == er.user]
            for i in range(0, len(doomed), PAGE):
                async with self.r.pipeline(transaction=True) as p:
                    p.hdel(self._ev(sk), *doomed[i:i + PAGE])
                    p.zrem(self._ord(sk), *doomed[i:i + PAGE])
                    await p.execute()

    async def checkpoints(self) -> dict[str, int]:
        """The writer's checkpoints. Its first look moves a view kept before hash tags to the
        tagged names (`connection.retag_once`): its turns may be past the topic's retention."""
        if not self._retagged:
            await retag_once(self.r, f"{self.ns}:layout:tagged", f"{self.ns}:*", self._retag)
            self._retagged = True
        return {k: int(v) for k, v in (await self.r.hgetall(f"{self.ns}:ckpt")).items()}

    def _retag(self, key: str) -> str | None:
        for kind in ("ev", "ord", "mem"):
            prefix = f"{self.ns}:{kind}:"
            if key.startswith(prefix) and "{" not in key and key.count("/") >= 2:
                return prefix + _tagged_session(key[len(prefix):])
        return None

    # ------------------------------------------------------------------ read side

    async def get_many(self, tenant: str, agent: str, session: str, ids: list[str]) -> list[KeptEvent]:
        if not ids:
            return []
        return await self._open_all(await self.r.hmget(self._ev(f"{tenant}/{agent}/{session}"), ids))

    async def _open_all(self, raws: list[bytes | None], text: bool = True) -> list[KeptEvent]:
        """The events of an HMGET's answer: missing ones left out, unreadable ones counted."""
        out = []
        for x in raws:
            if not x:
                continue
            e = await opening(self.keys, open_event, x, self.cipher, text)
            if e is None:
                self.unreadable += 1
            else:
                out.append(e)
        return out

    async def windows(self, tenant: str, agent: str, sessions: list[str]) -> dict[str, tuple[Window, ...] | None]:
        """Each session's membership windows (None: always a member), in one round trip."""
        sessions = list(dict.fromkeys(sessions))
        if not sessions:
            return {}
        async with self.r.pipeline(transaction=False) as p:
            for s in sessions:
                p.hvals(self._mem(f"{tenant}/{agent}/{s}"))
            got = await p.execute()
        return {s: membership_windows([decode_change(v) for v in vals]) for s, vals in zip(sessions, got, strict=True)}

    async def get_refs(self, tenant: str, agent: str, refs: list[tuple[str, str]], text: bool = True
                       ) -> tuple[dict[tuple[str, str], KeptEvent], dict[str, tuple[Window, ...] | None]]:
        """Events by (session, id) of one agent and their sessions' membership windows, in one
        round trip (one HMGET and one HVALS per session, pipelined; one agent's keys share a slot).
        `text=False`: without their texts (`open_event`)."""
        by_session: dict[str, list[str]] = {}
        for s, eid in refs:
            ids = by_session.setdefault(s, [])
            if eid not in ids:
                ids.append(eid)
        if not by_session:
            return {}, {}
        async with self.r.pipeline(transaction=False) as p:
            for s, ids in by_session.items():
                p.hmget(self._ev(f"{tenant}/{agent}/{s}"), ids)
                p.hvals(self._mem(f"{tenant}/{agent}/{s}"))
            got = await p.execute()
        events: dict[tuple[str, str], KeptEvent] = {}
        windows: dict[str, tuple[Window, ...] | None] = {}
        for i, s in enumerate(by_session):
            raws, vals = got[2 * i], got[2 * i + 1]
            windows[s] = membership_windows([decode_change(v) for v in vals])
            for e in await self._open_all(raws, text):
                events[(s, e.id)] = e
        return events, windows

    async def page(
        self, f: HistoryFilter, limit: int, after: tuple[int, str] | None = None
    ) -> tuple[list[KeptEvent], tuple[int, str] | None]:
        """Newest first, after `after` (the (order, id) of the last event of the previous page).
        Only what the agent could see: said while it was a member of the session."""
        sk = f"{f.tenant}/{f.agent}/{f.session}"
        w = (await self.windows(f.tenant, f.agent, [f.session]))[f.session]
        top = float("inf")
        if f.before_turn is not None:
            top = f.before_turn * SEQ_SLOTS - 1
        if after is not None:
            top = min(top, after[0])
        out: list[KeptEvent] = []
        offset, chunk = 0, max(limit * 4, 64)
        while len(out) <= limit:
            rows = await self.r.zrevrangebyscore(self._ord(sk), top, "-inf", start=offset, num=chunk, withscores=True)
            if not rows:
                break
            offset += len(rows)
            # Equal positions come in reverse id order; skip what the previous page returned.
            ids = [rid for rid, sc in rows if after is None or (int(sc), rid) < after]
            events = await self.get_many(f.tenant, f.agent, f.session, ids)
            out.extend(e for e in events if f.admits(e) and within(w, e.occurred_ms))
        more, out = len(out) > limit, out[:limit]
        return out, ((out[-1].order, out[-1].id) if more else None)

    async def in_order(
        self, f: HistoryFilter, limit: int, after: tuple[int, str] | None = None
    ) -> tuple[list[KeptEvent], tuple[int, str] | None]:
        """Oldest first, after `after` (the (order, id) of the last event of the previous page):
        a whole session read in order (`message_history`), what the agent could see of it."""
        sk = f"{f.tenant}/{f.agent}/{f.session}"
        w = (await self.windows(f.tenant, f.agent, [f.session]))[f.session]
        bottom: float | str = "-inf" if after is None else after[0]
        top: float | str = "+inf" if f.before_turn is None else f.before_turn * SEQ_SLOTS - 1
        out: list[KeptEvent] = []
        offset, chunk = 0, max(limit * 4, 64)
        while len(out) <= limit:
            rows = await self.r.zrangebyscore(self._ord(sk), bottom, top, start=offset, num=chunk, withscores=True)
            if not rows:
                break
            offset += len(rows)
            # Equal positions come in id order; skip what the previous page returned.
            ids = [rid for rid, sc in rows if after is None or (int(sc), rid) > after]
            events = await self.get_many(f.tenant, f.agent, f.session, ids)
            out.extend(e for e in events if f.admits(e) and within(w, e.occurred_ms))
        more, out = len(out) > limit, out[:limit]
        return out, ((out[-1].order, out[-1].id) if more else None)

    async def aclose(self) -> None:
        await self.r.aclose()
