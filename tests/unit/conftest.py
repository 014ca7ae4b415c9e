"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest

from events import codec
from projections.keys import Keyring, LocalKeyFile


@pytest.fixture
def keyring(tmp_path):
    """A local keyring sealing every event and command the codec encodes in the test, and none after."""
    ring = Keyring(LocalKeyFile.create(tmp_path / "memlane.key"))
    codec.use_cipher(ring)
    yield ring
    codec.use_cipher(None)
