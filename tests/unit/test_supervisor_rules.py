"""`memlane start`'s pure rules: the restart backoff, the process plan, readiness."""

from pathlib import Path

import pytest

from services.supervisor import Backoff, Child, parse_replicas, plan, probe_ports, readiness


def test_backoff_doubles_from_the_base_up_to_the_cap():
    b = Backoff(base_s=1.0, cap_s=30.0, reset_after_s=60.0)
    assert [b.delay(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    assert b.delay(10_000) == 30  # no overflow however long a child crash-loops


def test_quick_exits_in_a_row_grow_the_delay_and_a_long_run_resets_it():
    b = Backoff(base_s=0.5, cap_s=10.0, reset_after_s=60.0)
    failures, waits = 0, []
    for uptime in (0.1, 2.0, 59.9, 3.0, 1.0, 1.0):  # six crashes, none up a minute
        failures, wait = b.after_exit(failures, uptime)
        waits.append(wait)
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0]
    assert b.after_exit(failures, 60.0) == (1, 0.5)  # up long enough: healthy again
    assert b.after_exit(failures, 3600.0) == (1, 0.5)


def test_the_plan_runs_every_worker_and_the_api_and_replicas_share_a_kind():
    assert [kind for _, kind in plan(None, {})] == [
        "extraction", "consolidation", "ledger", "embedding", "redis-projection", "history", "api"]
    assert plan(["ledger", "api"], {"ledger": 2}) == [("ledger.1", "ledger"), ("ledger.2", "ledger"), ("api", "api")]
    assert parse_replicas(["ledger=2", "embedding=1"]) == {"ledger": 2, "embedding": 1}


@pytest.mark.parametrize("workers,replicas", [
    (["nope"], {}), (None, {"nope": 2}), (["ledger"], {"embedding": 2}), (None, {"api": 2})])
def test_the_plan_refuses_what_cannot_run(workers, replicas):
    with pytest.raises(ValueError):
        plan(workers, replicas)


@pytest.mark.parametrize("spec", ["ledger", "ledger=0", "ledger=x", "ledger=-1"])
def test_replicas_need_a_positive_count(spec):
    with pytest.raises(ValueError):
        parse_replicas([spec])


NOW = 1000.0  # the children below started at 0: up long enough to count


def _children(*states: tuple[str, str]) -> list[Child]:
    return [Child(kind, kind, Path(f"/tmp/{kind}.log"), state=state) for kind, state in states]


HEALTHY = {"status": "ok", "problems": [], "projection": {"caught_up": True},
           "workers": {"ledger": {"alive": True, "lag": 0}}}


def test_ready_needs_every_child_running_and_the_api_healthy_with_every_worker_beating():
    up = _children(("ledger", "running"), ("api", "running"))
    assert readiness(up, HEALTHY, 200, NOW) == []
    assert readiness(_children(("ledger", "backoff"), ("api", "running")), HEALTHY, 200, NOW) == ["ledger: backoff"]
    assert readiness(up, None, None, NOW) == ["api: /health does not answer yet"]
    assert readiness(up, {**HEALTHY, "status": "degraded", "problems": ["worker x: no heartbeat"]}, 503, NOW) == [
        "/health: worker x: no heartbeat"]
    assert readiness(up, {**HEALTHY, "projection": {"caught_up": False}}, 200, NOW) == [
        "api: memory projection catching up"]
    assert readiness(up, {**HEALTHY, "workers": {}}, 200, NOW) == ["ledger: no heartbeat yet"]
    # Without the API in the run, the children's own state is all there is to go by: a child
    # without a /ready of its own counts once it has stayed up a moment.
    assert readiness(_children(("ledger", "running")), None, None, NOW) == []
    assert readiness(_children(("ledger", "running")), None, None, 1.0) == ["ledger: starting"]


def test_a_probed_child_counts_once_its_own_ready_answers_200():
    ledger, api = _children(("ledger", "running"), ("api", "running"))
    ledger.probe_port = api.probe_port = 1
    assert readiness([ledger, api], HEALTHY, 200, NOW) == [
        "ledger: no answer on /ready (port 1) yet", "api: no answer on /ready (port 1) yet"]
    ledger.probe, api.probe = (503, ["catching up: 3 messages behind"]), (200, [])
    assert readiness([ledger, api], HEALTHY, 200, NOW) == ["ledger: not ready (catching up: 3 messages behind)"]
    ledger.probe = (200, [])
    assert readiness([ledger, api], HEALTHY, 200, NOW) == []


def test_each_child_gets_its_own_probe_port_replicas_past_the_usual_ones():
    index = {"api": 0, "ledger": 3, "embedding": 4}
    children = plan(["ledger", "embedding", "api"], {"ledger": 3})
    assert probe_ports(children, 39100, index) == {
        "ledger.1": 39103, "ledger.2": 39120, "ledger.3": 39121, "embedding": 39104, "api": 39100}
    assert probe_ports(children, None, index) == {}  # MEMLANE_METRICS_PORT=0: no probes
