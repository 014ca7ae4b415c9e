"""`message_size` bounds what the Kafka producer checks against the message limit, from the
message alone (no client internals): never under the client's own estimate, barely over."""

from __future__ import annotations

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from workers.runtime.runner import Out, message_size


@pytest.mark.parametrize(("key", "value", "headers"), [
    (b"", b"", ()),
    (b"t/a", b"v" * 100, ()),
    (b"k" * 300, b"v" * 1_048_000, (("error", b"e" * 2000), ("attempt", b"3"))),
    (b"k", b"v" * 70_000, tuple((f"h{i}", b"x" * 200) for i in range(20))),
])
def test_the_size_bounds_the_clients_estimate(key, value, headers):
    ours = message_size(Out("t", key, value, headers))
    theirs = DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, list(headers))
    assert theirs <= ours <= theirs + 60 + 10 * len(headers)
