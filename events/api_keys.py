"""API keys as `memlane.apikeys` holds them (docs/features/api-keys.md): one record per key, under the
key's digest (SHA-256), holding its public entry and, once revoked, when. Never the key.

A revocation is a value, not a tombstone: compaction keeps only the last record of each
digest, so a tombstone would let the cleaner forget that the key was ever revoked, and a
stale copy of it (a Redis restored from a backup) would work again. Revoked records cost a
few hundred bytes each and stay for good.

A key that was in Redis before the log held keys is adopted: published under its own message
key (`ADOPTED` + digest), so that a revocation, whenever it is written, wins over it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

ADOPTED = "adopted:"


def key_id(digest: str) -> str:
    """A key's public id: the start of its digest, enough to name it, useless to use it."""
    return digest[:16]


@dataclass(frozen=True)
class KeyRecord:
    digest: str
    entry: Mapping[str, Any]  # id, tenant, agent, role, created, and a member key's user
    revoked: str | None = None  # when it was revoked (ISO 8601); None while it works
    adopted: bool = False

    @property
    def topic_key(self) -> bytes:
        return f"{ADOPTED if self.adopted else ''}{self.digest}".encode()

    @property
    def tenant(self) -> str:
        return self.entry["tenant"]

    @property
    def id(self) -> str:
        return self.entry["id"]

    def encode(self) -> bytes:
        return json.dumps({"hash": self.digest, "entry": dict(self.entry), "revoked": self.revoked},
                          separators=(",", ":")).encode()

    @classmethod
    def decode(cls, key: bytes, value: bytes) -> KeyRecord:
        d = json.loads(value)
        adopted = key.decode().startswith(ADOPTED)
        return cls(d["hash"], d["entry"], d.get("revoked"), adopted)


class KeyBook:
    """The fold of the topic: each digest's last record; an adoption counts only while the
    digest has no record of its own."""

    def __init__(self) -> None:
        self._own: dict[str, KeyRecord] = {}
        self._adopted: dict[str, KeyRecord] = {}
        self._ids: dict[tuple[str, str], str] = {}  # (tenant, id) -> digest
        self._offsets: dict[str, int] = {}  # message key -> offset of the record held

    def apply(self, key: bytes, value: bytes | None, offset: int) -> KeyRecord | None:
        """The message at `offset`; the digest's record now (None: it has none). A message older
        than the one held changes nothing: a process learns its own writes as it sends them,
        before its follower reads what came before them. memlane writes no tombstones, but one
        (an operator's) forgets what its message key held."""
        name = key.decode()
        if offset <= self._offsets.get(name, -1):
            return self.get(name.removeprefix(ADOPTED))
        self._offsets[name] = offset
        adopted = name.startswith(ADOPTED)
        digest = name.removeprefix(ADOPTED)
        held = self._adopted if adopted else self._own
        if value is None:
            held.pop(digest, None)
        else:
            rec = KeyRecord.decode(key, value)
            held[digest] = rec
            self._ids[(rec.tenant, rec.id)] = digest
        return self.get(digest)

    def get(self, digest: str) -> KeyRecord | None:
        return self._own.get(digest) or self._adopted.get(digest)

    def find(self, tenant: str, kid: str) -> KeyRecord | None:
        """The tenant's key with this id."""
        digest = self._ids.get((tenant, kid))
        return None if digest is None else self.get(digest)

    def live(self, tenant: str) -> list[KeyRecord]:
        """The tenant's keys that work."""
        return [r for r in self if r.tenant == tenant and r.revoked is None]

    def __iter__(self) -> Iterator[KeyRecord]:
        for digest in {**self._adopted, **self._own}:
            rec = self.get(digest)
            if rec is not None:
                yield rec

    def __len__(self) -> int:
        return len(self._own.keys() | self._adopted.keys())
