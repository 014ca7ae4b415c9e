"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest

from events.codec import Codec
from projections.keys import Keyring, LocalKeyFile


@pytest.fixture
def keyring(tmp_path):
    """A local keyring of the test's own."""
    return Keyring(LocalKeyFile.create(tmp_path / "memlane.key"))


@pytest.fixture
def sealing(keyring):
    """A codec sealing every event and command it encodes with the test's keyring."""
    return Codec(keyring)
