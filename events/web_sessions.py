"""Web sessions as `memlane.websessions` holds them: one record per session under the SHA-256
of its cookie (never the cookie), naming the hash of the key it stands for, its CSRF token and
when it ends; a sign-out is a tombstone. The CSRF token alone opens nothing: a call needs the
cookie too, which only the browser holds."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass


def session_hash(sid: str) -> str:
    return hashlib.sha256(sid.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class SessionRecord:
    key: str  # the hash of the key it stands for (what the key store indexes keys by)
    csrf: str
    expires: float  # seconds since the epoch

    def encode(self) -> bytes:
        return json.dumps({"key": self.key, "csrf": self.csrf, "expires": self.expires},
                          separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes) -> SessionRecord:
        d = json.loads(value)
        return cls(d["key"], d["csrf"], float(d["expires"]))

    def left_s(self, now: float | None = None) -> float:
        return self.expires - (time.time() if now is None else now)


class SessionBook:
    """The fold of the topic: each live session's last record."""

    def __init__(self) -> None:
        self._held: dict[str, SessionRecord] = {}
        # Message key -> offset of the last message applied. A process learns its own writes as
        # it sends them, before its follower reads what came before them: an older message
        # (a sign-in read after its own sign-out) changes nothing.
        self._offsets: dict[str, int] = {}

    def apply(self, name: str, value: bytes | None, offset: int) -> None:
        if offset <= self._offsets.get(name, -1):
            return
        self._offsets[name] = offset
        if value is None:
            self._held.pop(name, None)
        else:
            self._held[name] = SessionRecord.decode(value)

    def get(self, name: str, now: float | None = None) -> SessionRecord | None:
        rec = self._held.get(name)
        if rec is not None and rec.left_s(now) <= 0:
            del self._held[name]  # ended: the topic's retention drops it too
            self._offsets.pop(name, None)
            return None
        return rec

    def __len__(self) -> int:
        return len(self._held)
