"""Data keys: the AES-GCM keyring every process seals and opens with, and the key providers
that wrap data keys under a tenant's key-encryption key (docs/features/encryption-and-erasure.md)."""

from projections.keys.keyring import KeyRecord, Keyring
from projections.keys.provider import KeyProvider, LocalKeyFile

__all__ = ["KeyProvider", "KeyRecord", "Keyring", "LocalKeyFile"]
