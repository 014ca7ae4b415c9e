"""Fault points: a process kills itself the n-th time it reaches the named point, and no other."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from workers.runtime.faults import Faults

SCRIPT = """
import sys
from workers.runtime.faults import Faults
f = Faults(sys.argv[1])
for i in range(5):
    f.reached("other.point")
    f.reached("ledger.before_commit")
    print(i, flush=True)
"""


def run(spec: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, spec], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_the_process_kills_itself_the_nth_time_it_reaches_the_point():
    r = run("ledger.before_commit@3")
    assert r.returncode == -signal.SIGKILL and r.stdout.split() == ["0", "1"]


def test_the_first_arrival_by_default_and_never_at_another_point():
    assert run("ledger.before_commit").stdout == ""
    r = run("ledger.after_commit")
    assert r.returncode == 0 and r.stdout.split() == ["0", "1", "2", "3", "4"]


def test_no_point_is_one_comparison_and_a_bad_count_is_refused():
    Faults(None).reached("ledger.before_commit")  # unset: nothing happens
    with pytest.raises(ValueError, match="MEMLANE_FAULT_AT"):
        Faults("ledger.before_commit@0")
