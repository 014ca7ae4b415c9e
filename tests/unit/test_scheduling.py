"""Which test process a test runs in: its shared stack's group, or its module's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.scheduling import group_of


def item(nodeid: str, *fixtures: str) -> SimpleNamespace:
    return SimpleNamespace(nodeid=nodeid, fixturenames=["settings", *fixtures])


def test_a_test_runs_with_its_shared_stack_or_else_with_its_module():
    assert group_of(item("tests/e2e/test_a.py::t1", "stack", "new_agent")) == "session-stack"
    assert group_of(item("tests/e2e/test_b.py::t2", "model_stack")) == group_of(item("tests/e2e/test_c.py::t", "jobs_stack"))
    assert group_of(item("tests/e2e/test_b.py::t3[x]", "fake")) == "tests/e2e/test_b.py"
    assert group_of(item("tests/e2e/test_b.py::t2", "model_stack")) != "session-stack"


def test_a_test_asking_for_stacks_of_two_groups_is_refused():
    with pytest.raises(pytest.UsageError, match="two groups"):
        group_of(item("tests/e2e/test_d.py::t", "stack", "model_stack"))
