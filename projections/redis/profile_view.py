"""Redis adapter of the profile view: each member's profile on an agent (docs/features/profiles.md).

One hash per agent in the record view's generation namespace, `profiles:{<tenant>/<agent>}`
(the agent's hash tag, so it shares the agent's slot): field `<user>` holds the member's last
`ProfileChanged` as logged, its text sealed under the member's key as in the log. A deleted
profile (no text) leaves the hash. The redis-projection worker folds the events (`fold`) in the
same pass as the records, so a rebuild fills it from the log too; a member's or an agent's
erasure drops the field or the hash (`projections.redis.record_view`, `PROFILE_KIND`), and a
rebuild after it finds the events sealed under destroyed keys and skips them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from events.codec import Codec
from events.topics import EVENTS
from projections.records import opening
from projections.redis.connection import agent_tag
from projections.redis.view_store import ViewStore

PROFILE_EVENTS = ("ProfileChanged",)
PROFILE_KIND = "profiles"  # the agent's key kind (`record_view.agent_key`)


class _ProfileFields(msgspec.Struct, kw_only=True):
    """The fields the view keys by: never sealed, so read without opening."""

    type: str
    tenant: str
    agent: str
    user: str
    version: int
    text: str = ""
    sealed: str | None = None


_FIELDS = msgspec.json.Decoder(_ProfileFields, strict=False)


def profiles_key(ns: str, tenant: str, agent: str) -> str:
    return f"{ns}:{PROFILE_KIND}:{agent_tag(f'{tenant}/{agent}')}"


def fold(pipe: Any, ns: str, raw: bytes | str) -> None:
    """Queues on `pipe` what a logged `ProfileChanged` changes. Events of one agent come in log
    order, so the last applied is the newest; applied again from an older checkpoint, the same
    events leave the same hash."""
    f = _FIELDS.decode(raw)
    key = profiles_key(ns, f.tenant, f.agent)
    if f.text or f.sealed is not None:
        pipe.hset(key, f.user, raw)
    else:
        pipe.hdel(key, f.user)


@dataclass(frozen=True)
class Profile:
    user: str
    text: str
    version: int

    def as_json(self) -> dict[str, Any]:
        return {"user": self.user, "text": self.text, "version": self.version}


def _profile(raw: bytes | str, codec: Codec) -> Profile:
    e = codec.decode(EVENTS.name, raw)
    return Profile(e.user, e.text, e.version)


class ProfileView:
    """Reads of the profile view, over the record view's client and generation."""

    def __init__(self, records: ViewStore) -> None:
        self.records = records

    async def read(self, tenant: str, agent: str, user: str) -> Profile | None:
        """The member's profile, or None: none written, deleted, erased, or sealed under a destroyed key."""
        rec = self.records
        ns = await rec.namespace()
        raw = await rec.r.hget(profiles_key(ns, tenant, agent), user)
        if raw is None:
            return None
        got = await opening(rec.keys, _profile, raw, rec.codec)
        return got if got is not None and got.text else None
