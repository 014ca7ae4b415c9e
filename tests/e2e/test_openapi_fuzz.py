"""schemathesis against the served OpenAPI document: no input produces a 5xx."""

from __future__ import annotations

import httpx
import schemathesis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from schemathesis.checks import not_a_server_error

from events import AgentConfig


def test_no_input_makes_a_server_error(stack, settings):
    with httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {settings.operator_key}"}) as op:
        key = op.post("/v1/admin/keys", json={"tenant": "fuzz", "agent": "fuzzer"}).json()["key"]
        op.put("/v1/config", headers={"X-Tenant": "fuzz", "X-Agent": "fuzzer"},
               json=AgentConfig().model_dump(mode="json")).raise_for_status()
    schema = schemathesis.openapi.from_url(f"{stack.api_url}/openapi.json")
    operations = [r.ok() for r in schema.get_all_operations()]
    assert len(operations) >= 10
    for operation in operations:

        @given(case=operation.as_strategy())
        @hsettings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def fuzz(case):
            case.headers = {**(case.headers or {}), "Authorization": f"Bearer {key}", "X-Session": "fuzz"}
            case.call_and_validate(base_url=stack.api_url, checks=[not_a_server_error])

        fuzz()
