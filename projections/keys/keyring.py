"""The keyring: data keys by id (kid), each subject's current one, and AES-256-GCM sealing
(`events.sealing.Cipher`). It learns keys from the compacted keys topic (`apply`) and makes
new ones itself (`pending`, to be published before anything sealed under them is)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from events.sealing import KeyDestroyed, KeyMissing, tenant_of
from projections.keys.provider import KeyProvider


@dataclass(frozen=True)
class KeyRecord:
    """One wrapped data key as the keys topic holds it, under the message key `subject#kid`."""

    subject: str
    kid: str
    kek: str
    wrapped: bytes
    created: datetime

    @property
    def topic_key(self) -> bytes:
        return f"{self.subject}#{self.kid}".encode()

    @property
    def aad(self) -> bytes:
        # A wrapped key cannot be moved to another subject or id.
        return self.topic_key

    def encode(self) -> bytes:
        return json.dumps({"subject": self.subject, "kid": self.kid, "kek": self.kek,
                           "wrapped": base64.b64encode(self.wrapped).decode(),
                           "created": self.created.isoformat()}).encode()

    @classmethod
    def decode(cls, value: bytes) -> KeyRecord:
        d = json.loads(value)
        return cls(d["subject"], d["kid"], d["kek"], base64.b64decode(d["wrapped"]), datetime.fromisoformat(d["created"]))


def kid_of_topic_key(key: bytes) -> tuple[str, str]:
    subject, _, kid = key.decode().rpartition("#")
    return subject, kid


# msgspec's base64 decoder: twice as fast as binascii's on a sealed vector (2 kB), the token
# most opened in a rebuild.
_B64 = msgspec.json.Decoder(bytes)


class Keyring:
    def __init__(self, provider: KeyProvider) -> None:
        self.provider = provider
        self._aead: dict[str, AESGCM] = {}
        self._macs: dict[str, bytes] = {}  # kid -> the key vector names are keyed with (`mac`)
        self._records: dict[str, KeyRecord] = {}
        self._by_subject: dict[str, dict[str, None]] = {}  # subject -> its kids, oldest first
        self.destroyed: set[str] = set()
        # Called with the subject of each key destroyed (a tombstone read from the topic).
        self.on_destroy: list[Callable[[str], None]] = []
        self.pending: list[KeyRecord] = []
        self.sealed = self.opened = 0

    # -- the keys topic --------------------------------------------------------------
    def apply(self, key: bytes, value: bytes | None) -> None:
        """One message of the keys topic: a wrapped key, or a tombstone that destroys one."""
        subject, kid = kid_of_topic_key(key)
        if value is None:
            known = kid in self._records
            self._forget(subject, kid)
            self.destroyed.add(kid)
            if known:
                for callback in self.on_destroy:
                    callback(subject)
            return
        rec = KeyRecord.decode(value)
        if kid in self.destroyed:
            return
        self._remember(rec)

    def _remember(self, rec: KeyRecord) -> None:
        data_key = self.provider.unwrap(tenant_of(rec.subject), rec.kek, rec.aad, rec.wrapped)
        self._use(rec.kid, data_key)
        self._records[rec.kid] = rec
        self._by_subject.setdefault(rec.subject, {})[rec.kid] = None

    def _forget(self, subject: str, kid: str) -> None:
        self._aead.pop(kid, None)
        self._macs.pop(kid, None)
        self._records.pop(kid, None)
        kids = self._by_subject.get(subject)
        if kids is not None:
            kids.pop(kid, None)
            if not kids:
                del self._by_subject[subject]
        self.pending = [p for p in self.pending if p.kid != kid]

    def kids(self, subject: str) -> list[KeyRecord]:
        return [self._records[k] for k in self._by_subject.get(subject, ())]

    def subjects(self) -> list[str]:
        return list(self._by_subject)

    def records(self) -> list[KeyRecord]:
        return list(self._records.values())

    def rewrapped(self, rec: KeyRecord) -> KeyRecord:
        """`rec` wrapped again under the provider's current KEK (key rotation)."""
        data_key = self.provider.unwrap(tenant_of(rec.subject), rec.kek, rec.aad, rec.wrapped)
        kek, wrapped = self.provider.wrap(tenant_of(rec.subject), rec.aad, data_key)
        return KeyRecord(rec.subject, rec.kid, kek, wrapped, rec.created)

    # -- events.sealing.Cipher ---------------------------------------------------------
    def current_kid(self, subject: str) -> str:
        kids = self._by_subject.get(subject)
        if kids:
            return next(reversed(kids))
        data_key = AESGCM.generate_key(256)
        kid = os.urandom(8).hex()
        created = datetime.now(UTC)
        aad = f"{subject}#{kid}".encode()
        kek, wrapped = self.provider.wrap(tenant_of(subject), aad, data_key)
        rec = KeyRecord(subject, kid, kek, wrapped, created)
        self._use(kid, data_key)
        self._records[kid] = rec
        self._by_subject.setdefault(subject, {})[kid] = None
        self.pending.append(rec)
        return kid

    def seal(self, subject: str, aad: bytes, plaintext: bytes) -> str:
        kid = self.current_kid(subject)
        nonce = os.urandom(12)
        self.sealed += 1
        return f"{kid}.{base64.b64encode(nonce + self._aead[kid].encrypt(nonce, plaintext, aad)).decode()}"

    def open(self, token: str, aad: bytes) -> bytes:
        kid, _, body = token.partition(".")
        aead = self._aead.get(kid)
        if aead is None:
            raise (KeyDestroyed if kid in self.destroyed else KeyMissing)(kid)
        try:
            raw = _B64.decode(b'"' + body.encode() + b'"')
            plain = aead.decrypt(raw[:12], raw[12:], aad)
        except (InvalidTag, msgspec.DecodeError):
            raise ValueError("the sealed data does not match its key or associated data") from None
        self.opened += 1
        return plain

    def knows(self, kid: str) -> bool:
        return kid in self._aead

    def mac(self, kid: str, data: bytes) -> bytes:
        """HMAC-SHA256 of `data` under a key derived from data key `kid`: a name (a vector's
        on memlane.vectors) no one without the key can compute or check a guess against.
        Raises `KeyMissing` or `KeyDestroyed` as `open` does."""
        mac_key = self._macs.get(kid)
        if mac_key is None:
            raise (KeyDestroyed if kid in self.destroyed else KeyMissing)(kid)
        return hmac.new(mac_key, data, hashlib.sha256).digest()

    def _use(self, kid: str, data_key: bytes) -> None:
        self._aead[kid] = AESGCM(data_key)
        # A separate key for names (HKDF of the data key), so sealing and naming never share one.
        self._macs[kid] = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"memlane/mac").derive(data_key)
