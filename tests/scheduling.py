"""Which test process runs which test (`make test` runs two, pytest-xdist): every test on a
shared stack in the process that started it, and a module of its own stack's in one process.
pytest-xdist's own `xdist_group` marks cannot do it under pytest 9.2 (they rename the node id
through an attribute pytest no longer reads), so the workers write each test's group to a file
and the controller's scheduler reads it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

# The shared stacks a test can ask for, each named for the group of every test that asks for it.
SHARED_STACKS = {"stack": "session-stack", "model_stack": "model-stacks", "jobs_stack": "model-stacks",
                 "bare_stack": "bare-stack"}


def group_of(item: pytest.Item) -> str:
    """The shared stack a test runs on, or else its module: a module's own fixtures start once."""
    groups = {SHARED_STACKS[f] for f in getattr(item, "fixturenames", ()) if f in SHARED_STACKS}
    if len(groups) > 1:
        raise pytest.UsageError(f"{item.nodeid} asks for stacks of two groups {sorted(groups)}: the "
                                "process running it would start a stack another one already runs")
    return groups.pop() if groups else item.nodeid.split("::")[0]


def write_groups(path: Path, items: list[pytest.Item]) -> None:
    """Every worker collects the same tests: each writes the whole map, atomically."""
    tmp = path.with_suffix(f".{os.getpid()}")
    tmp.write_text(json.dumps({item.nodeid: group_of(item) for item in items}))
    tmp.replace(path)


class GroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling, each scope a group: a group's tests go to one worker, in order."""

    def __init__(self, config: pytest.Config, log=None) -> None:
        super().__init__(config, log)
        self._path = Path(os.environ["MEMLANE_TEST_GROUPS"])
        self._groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:  # the workers wrote it before they reported their collection
            self._groups = json.loads(self._path.read_text())
        return self._groups[nodeid]
