"""No input produces a server error (a 5xx but 503 and 504): schemathesis against the served
OpenAPI document, with its health checks on, and hostile values (lone surrogates, NaN, deep
nesting, huge strings, odd headers) in every operation, with a fixed seed. 503/504 answers,
timeouts and dropped connections are counted apart and shown, not failed on. A server error's
input is kept in the example database (.run/fuzz-examples) and replayed first on the next run.
`tests.e2e.fuzz_support.run_fuzz` also gives the bench its figures."""

from __future__ import annotations

import time

from tests.e2e.fuzz_support import run_fuzz


def test_no_input_makes_a_server_error(stack, settings):
    t0 = time.monotonic()
    counts = run_fuzz(stack.api_url, settings.operator_key, examples=40, hostile_examples=40)
    figures = {**counts.as_figures(), "seconds": round(time.monotonic() - t0, 1), "digest": counts.digest}
    print(f"fuzz figures: {figures}")
    assert counts.server_errors == 0, counts.failure_report()
    assert counts.requests >= 1000, figures
