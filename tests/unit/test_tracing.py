"""Tracing's rules that need no collector: off by default, and a message's own trace kept."""

from __future__ import annotations

import pytest

from services.bootstrap import tracing
from settings import Settings
from workers.runtime.tracing import NO_TRACING, TRACEPARENT, carried, parent_of

PARENT = (TRACEPARENT, b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")


def test_off_unless_an_endpoint_is_set():
    assert tracing(Settings(), "api") is NO_TRACING
    with NO_TRACING.consumed("ledger x", [PARENT]) as header:
        assert header == ()


def test_an_endpoint_turns_it_on_with_the_standard_name(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    t = tracing(Settings(), "api")
    try:
        assert t.enabled
    finally:
        t.shutdown()


def test_an_output_keeps_a_trace_it_names_and_gets_the_span_otherwise():
    mine = (TRACEPARENT, b"00-11111111111111111111111111111111-2222222222222222-01")
    assert carried((("k", b"v"),), (PARENT,)) == (("k", b"v"), PARENT)
    assert carried((mine,), (PARENT,)) == (mine,)
    assert carried((("k", b"v"),), ()) == (("k", b"v"),)
    assert parent_of([("k", b"v"), PARENT]) == PARENT[1].decode()


@pytest.mark.parametrize("ratio", ["-0.1", "1.5"])
def test_a_sample_ratio_outside_0_to_1_is_refused_naming_it(monkeypatch, ratio):
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", ratio)
    with pytest.raises(ValueError, match="OTEL_TRACES_SAMPLER_ARG"):
        Settings()
