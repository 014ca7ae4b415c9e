"""The key-provider port: wraps and unwraps data keys under a tenant's key-encryption key
(KEK). `LocalKeyFile` is the embedded default; a cloud KMS or Vault adapter implements the
same three methods (docs/features/encryption-and-erasure.md, "Key providers")."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Protocol

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF


class KeyProvider(Protocol):
    @property
    def current(self) -> str:
        """The KEK version new data keys are wrapped under."""

    def wrap(self, tenant: str, aad: bytes, data_key: bytes) -> tuple[str, bytes]:
        """(KEK version, wrapped key)."""

    def unwrap(self, tenant: str, version: str, aad: bytes, wrapped: bytes) -> bytes:
        """Raises KeyError for a KEK version the provider no longer holds."""


class LocalKeyFile:
    """Master keys in a local file (mode 0600, never committed): `{"current": v, "keys":
    {v: base64}}`. A tenant's KEK is HKDF-SHA256 of the master key with the tenant as info,
    so one file serves every tenant and a tenant's KEK never leaves this process."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._keks: dict[tuple[str, str], AESGCM] = {}
        self._load()

    def _load(self) -> None:
        self._mtime = self._stamp()
        data = json.loads(self.path.read_text())
        self._masters = {v: base64.b64decode(k) for v, k in data["keys"].items()}
        self._current = data["current"]

    def _stamp(self) -> tuple[int, int]:
        st = self.path.stat()  # a rewrite is a new file (os.replace): its inode changes
        return st.st_ino, st.st_mtime_ns

    def _reload_if_changed(self) -> None:
        """A rotation in another process: wrap under the new current version from now on, so
        `memlane kek retire` never strands a key wrapped under a version it drops."""
        if self._stamp() != self._mtime:
            self._load()

    @classmethod
    def create(cls, path: Path) -> LocalKeyFile:
        """The file at `path`, made with a fresh master key if there is none. Concurrent
        creators race on the link, so all of them end up with the same key."""
        path = Path(path)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            body = json.dumps({"current": "1", "keys": {"1": base64.b64encode(os.urandom(32)).decode()}})
            tmp = path.with_suffix(f".new{os.getpid()}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)  # whole or not at all: a reader never sees half a file
            except FileExistsError:
                pass
            finally:
                os.unlink(tmp)
        return cls(path)

    @property
    def current(self) -> str:
        return self._current

    @property
    def versions(self) -> list[str]:
        return sorted(self._masters, key=int)

    def _kek(self, tenant: str, version: str) -> AESGCM:
        kek = self._keks.get((tenant, version))
        if kek is None:
            hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=f"memlane/kek/{tenant}".encode())
            kek = self._keks[tenant, version] = AESGCM(hkdf.derive(self._masters[version]))
        return kek

    def wrap(self, tenant: str, aad: bytes, data_key: bytes) -> tuple[str, bytes]:
        self._reload_if_changed()
        nonce = os.urandom(12)
        return self._current, nonce + self._kek(tenant, self._current).encrypt(nonce, data_key, aad)

    def unwrap(self, tenant: str, version: str, aad: bytes, wrapped: bytes) -> bytes:
        if version not in self._masters:
            self._reload_if_changed()
        return self._kek(tenant, version).decrypt(wrapped[:12], wrapped[12:], aad)

    def rotate(self) -> str:
        """Adds a master key and makes it current; `retire` drops an old one once every data
        key is wrapped again under the new one."""
        version = str(max(map(int, self._masters)) + 1)
        self._masters[version] = os.urandom(32)
        self._current = version
        self._save()
        return version

    def retire(self, version: str) -> None:
        if version == self._current:
            raise ValueError("the current KEK cannot be retired")
        self._masters.pop(version, None)
        self._keks = {k: v for k, v in self._keks.items() if k[1] != version}
        self._save()

    def _save(self) -> None:
        body = json.dumps({"current": self._current,
                           "keys": {v: base64.b64encode(k).decode() for v, k in self._masters.items()}})
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._mtime = self._stamp()
