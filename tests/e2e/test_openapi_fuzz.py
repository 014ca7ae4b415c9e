"""No input produces a 5xx: schemathesis against the served OpenAPI document, with its health
checks on, and hostile values (lone surrogates, NaN, deep nesting, huge strings, odd headers)
in every operation. `tests.e2e.fuzz_support.run_fuzz` also gives the bench its figures."""

from __future__ import annotations

from tests.e2e.fuzz_support import run_fuzz


def test_no_input_makes_a_server_error(stack, settings):
    counts = run_fuzz(stack.api_url, settings.operator_key, examples=40, hostile_examples=40)
    assert counts.requests >= 1000, counts.as_figures()
    assert counts.server_errors == 0, counts.examples
