"""Redis adapter of the run view: session memory (docs/features/session-memory.md).

Each run of an agent is one hash in the record view's generation namespace,
`run:{<tenant>/<agent>}|<user>|<run>` (a run is one member's, or the agent's own with no
member; the agent's hash tag, so it shares the agent's slot): field
`e:<entry id>` holds a `RunEntryAdded` as logged (its text sealed, as the record view keeps
versions), `summary` the last `RunSummarized`, and `last` the run's last write. The
redis-projection worker folds both events (`fold`) in the same pass as the records, so a
rebuild fills it from the log too. Reads hide a run 48 hours after its last write
(`events.rules.runs.visible`); the key's own expiry, an hour later, only collects it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import msgspec

from events.codec import Codec
from events.rules import runs as rules
from events.topics import EVENTS
from projections.records import opening
from projections.redis.connection import agent_tag, scan_keys, unlink_keys
from projections.redis.view_store import ViewStore

RUN_EVENTS = ("RunEntryAdded", "RunSummarized")
GC_GRACE = timedelta(hours=1)  # the key outlives what reads show by this much, then Redis drops it


class _RunFields(msgspec.Struct, kw_only=True):
    """The fields of a run event the view keys by: never sealed, so read without opening."""

    type: str
    tenant: str
    agent: str
    run: str
    user: str | None = None
    entry_id: str | None = None
    entry_ids: list[str] = []
    run_last_write: datetime | None = None
    starts_run: bool = False


_FIELDS = msgspec.json.Decoder(_RunFields, strict=False)


def run_key(ns: str, tenant: str, agent: str, run: str, user: str | None = None) -> str:
    return f"{ns}:run:{agent_tag(f'{tenant}/{agent}')}|{user or ''}|{run}"


def fold(pipe: Any, ns: str, raw: bytes | str) -> None:
    """Queues on `pipe` what a logged run event changes. Idempotent in log order: applied
    again from an older checkpoint, the same events leave the same hash."""
    f = _FIELDS.decode(raw)
    key = run_key(ns, f.tenant, f.agent, f.run, f.user)
    if f.type == "RunEntryAdded":
        if f.starts_run:  # a run written again after it expired starts over, as in the ledger
            pipe.delete(key)
        pipe.hset(key, mapping={f"e:{f.entry_id}": raw, "last": f.run_last_write.isoformat()})
    else:
        if f.entry_ids:
            pipe.hdel(key, *(f"e:{eid}" for eid in f.entry_ids))
        pipe.hset(key, "summary", raw)
    if f.run_last_write is not None:
        gc = rules.expires_at(f.run_last_write) + GC_GRACE
        pipe.pexpireat(key, int(gc.timestamp() * 1000))


async def purge(records: ViewStore, ns: str, tenant: str, agent: str, user: str | None) -> None:
    """Drops the runs of an erased member on the agent (`user`), or every run of an erased
    agent: sealed under destroyed keys, nothing in them could be read, and nothing should
    wait for the key's expiry to go."""
    pattern = run_key(ns, tenant, agent, "*", user) if user else f"{ns}:run:{agent_tag(f'{tenant}/{agent}')}|*"
    await unlink_keys(records.r, [k async for k in scan_keys(records.r, pattern)], 500)


def _entry(raw: bytes | str, codec: Codec) -> rules.Entry:
    e = codec.decode(EVENTS.name, raw)
    return rules.Entry(id=e.entry_id, at=e.occurred_at, summary=e.summary, content=e.content, kind=e.kind,
                       record_id=e.record_id)


def _summary(raw: bytes | str, codec: Codec) -> str:
    return codec.decode(EVENTS.name, raw).summary


@dataclass(frozen=True)
class RunSession:
    """What a read shows of a run: its entries oldest first, its summary, and when it expires."""

    run: str
    entries: list[rules.Entry]
    summary: str | None
    expires_at: datetime | None

    def as_json(self) -> dict[str, Any]:
        return {"run_id": self.run, "sessionEntries": [e.as_json() for e in self.entries],
                "sessionSummary": self.summary,
                "expires_at": self.expires_at.isoformat() if self.expires_at else None}


class RunView:
    """Reads of the run view, over the record view's client and generation."""

    def __init__(self, records: ViewStore) -> None:
        self.records = records

    async def read(self, tenant: str, agent: str, run: str, now: datetime, user: str | None = None) -> RunSession:
        """The run of `user` (None: the agent's own, written with no member named)."""
        rec = self.records
        ns = await rec.namespace()
        stored = await rec.r.hgetall(run_key(ns, tenant, agent, run, user))
        last = stored.get("last") or stored.get(b"last")
        last_at = datetime.fromisoformat(last.decode() if isinstance(last, bytes) else last) if last else None
        entries: list[rules.Entry] = []
        summary: str | None = None
        for field, raw in stored.items():
            name = field.decode() if isinstance(field, bytes) else field
            if name.startswith("e:"):
                if (e := await opening(rec.keys, _entry, raw, rec.codec)) is not None:
                    entries.append(e)
            elif name == "summary":
                summary = await opening(rec.keys, _summary, raw, rec.codec)
        shown, summary = rules.visible(entries, summary, last_at, now)
        expires = rules.expires_at(last_at) if last_at and (shown or summary) else None
        return RunSession(run, shown, summary, expires)

    async def session(self, tenant: str, agent: str, run: str, now: datetime,
                      user: str | None = None) -> tuple[list[rules.Entry], str | None]:
        """The run's live entries (oldest first) and summary at `now`: ([], None) once it expired."""
        s = await self.read(tenant, agent, run, now, user)
        return s.entries, s.summary
