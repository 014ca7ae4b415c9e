from __future__ import annotations

import pytest

from events import codec


@pytest.fixture(autouse=True)
def _own_cipher():
    """A test that runs a worker in this process installs its keys as the process's cipher
    (`workers.keys.open_keys`); the next test starts with the cipher it had before."""
    before = codec.cipher()
    yield
    codec.use_cipher(before)
