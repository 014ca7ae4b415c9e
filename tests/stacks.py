"""The test session's shared stacks and their fixtures, for the e2e and resilience tiers: the
session stack (no model), the model stack (the scripted model and the test profile), the jobs
stack, the bare deployment, and the clients they hand out. Registered once by tests/conftest.py,
so each starts once a session."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

import pytest

from events import AgentConfig
from services.client import MemlaneClient, TurnPublisher
from services.stack import Stack, free_port, stack_env
from settings import Settings

# The module, not the name: it imports this one's conftest, so a bench importing it first finds it half made.
from tests.e2e import extraction_support
from tests.fakes.model_server import FakeModel
from tests.otlp_receiver import OtlpReceiver
from tests.private_redis import PrivateRedis

# The session stack's API port; the model stack's ports sit beside it (clear of the ephemeral range).
API_PORT = int(os.environ.get("MEMLANE_TEST_API_PORT", "28181"))
MODEL_API_PORT = API_PORT + 1
MODEL_METRICS_BASE = API_PORT + 1100  # + workers.runtime.metrics.PORT_INDEX for each process
# The test profile of the model stack: short model timeouts and retries, fresh configuration
# within half a second, debug logs (checked for personal data), every process's metrics, and
# the ledger's retention pass every 2 s instead of nightly (tests/e2e/test_retention.py; it
# touches only tombstones 180 days old and facts past their expiry, which reads skip anyway).
MODEL_PROFILE = {
    "MEMLANE_MODEL_TIMEOUT_S": "1.5", "MEMLANE_MODEL_RETRIES": "2", "MEMLANE_MODEL_BACKOFF_S": "0.1",
    "MEMLANE_CONFIG_CACHE_S": "0.5", "MEMLANE_LOG_LEVEL": "DEBUG",
    "MEMLANE_METRICS_PORT_BASE": str(MODEL_METRICS_BASE), "MEMLANE_METRICS_EVERY_S": "0.5",
    "MEMLANE_RETENTION_EVERY_S": "2",
}


@pytest.fixture(scope="session")
def stack(settings, infra, tmp_path_factory):
    env = stack_env(
        MEMLANE_TOPIC_PREFIX=settings.topic_prefix,
        MEMLANE_DATA_DIR=str(settings.data_dir),
        MEMLANE_API_PORT=str(settings.api_port),
        **infra,
    )
    s = Stack(env, tmp_path_factory.mktemp("logs"))
    try:
        s.start_all()
        yield s
    finally:
        s.stop()


@pytest.fixture
async def operator(stack, settings):
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant="ops", agent="ops") as c:
        yield c


@pytest.fixture
async def publisher(settings):
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as p:
        yield p


@pytest.fixture
def new_agent(stack, settings):
    """Factory: a fresh tenant/agent with a key and a configuration; returns (tenant, agent, key)."""

    async def make(config: AgentConfig | dict | None = None, role: str = "agent"):
        tenant, agent = f"ten{uuid.uuid4().hex[:6]}", f"agent{uuid.uuid4().hex[:6]}"
        async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
            key = await op.issue_key(tenant, agent, role)
            await op.configure(config or AgentConfig())
        return tenant, agent, key

    return make


@pytest.fixture(scope="session")
def fake():
    """The scripted OpenAI-compatible model server, one per test session: each test routes its
    answers by a marker of its own, so modules sharing it never take each other's answers."""
    f = FakeModel().start()
    yield f
    f.stop()


@pytest.fixture(scope="session")
def otlp():
    """The trace receiver the model stack exports to."""
    r = OtlpReceiver().start()
    yield r
    r.stop()


@pytest.fixture(scope="session")
def model_stack(fake, otlp, infra, settings, tmp_path_factory):
    """The pipeline wired to the scripted model (chat and embeddings), shared by every module
    that needs the model and no settings of its own: (stack, its settings). One process per
    worker, so a test can kill one of them and start it again. It traces, to `otlp`; the other
    stacks do not, so both ways are run."""
    prefix = f"{settings.topic_prefix}model."  # deleted with the run's topics
    traced = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, "OTEL_BSP_SCHEDULE_DELAY": "200"}
    stack, msettings = extraction_support.extraction_stack(
        fake.url, prefix, tmp_path_factory.mktemp("model"), MODEL_API_PORT, **MODEL_PROFILE, **traced, **infra)
    try:
        stack.start_all()
        yield stack, msettings
    finally:
        stack.stop()


# The jobs stack's profile: the scheduled jobs every second (the sweep; a shard optimised past a
# dozen unindexed points) and a review dead-lettered on its first timeout. The model stack's
# modules must not have these: its 2 s retention pass would race the sweep, an optimise would
# rebuild its whole log again and again, and `memlane dlq replay --all` would resend their turns.
JOBS_PROFILE = {
    "MEMLANE_MODEL_TIMEOUT_S": "3", "MEMLANE_MODEL_RETRIES": "0", "MEMLANE_CONFIG_CACHE_S": "0.5",
    "MEMLANE_SWEEP_EVERY_S": "1", "MEMLANE_OPTIMIZE_UNINDEXED_POINTS": "12", "MEMLANE_OPTIMIZE_CHECK_S": "1",
}


@pytest.fixture(scope="session")
def jobs_stack(fake, infra, settings, tmp_path_factory):
    """The pipeline on the scripted model with JOBS_PROFILE, shared by the scheduled-jobs and
    dead-letter replay modules: (stack, its settings). No worker of it is killed alone, so one
    process runs them all."""
    prefix = f"{settings.topic_prefix}jobs."  # deleted with the run's topics
    stack, jsettings = extraction_support.extraction_stack(
        fake.url, prefix, tmp_path_factory.mktemp("jobs"), free_port(), **JOBS_PROFILE, **infra)
    try:
        stack.start_all(together=True)
        yield stack, jsettings
    finally:
        stack.stop()


# The bare deployment's modules, in the order they run: each reads a count the later ones would
# change. No memory record is in the log before the memory-index test's, none waits unembedded
# before a module that runs the embedding worker (the readiness test's 30,000 records do, so it
# goes last), and the supervisor's `memlane start` finds nothing left to catch up on.
BARE_ORDER = ("test_history_rebuild", "test_qdrant_server_mode", "test_crash_recovery", "test_erasure_ledger",
              "test_redis_outage", "test_redis_wiped", "test_supervisor", "test_readiness")


@dataclass
class Bare:
    stack: Stack
    settings: Settings
    redis: PrivateRedis  # its own: the outage test stops it and starts it again


@pytest.fixture(scope="session")
def bare_deployment(infra, settings, tmp_path_factory):
    root = tmp_path_factory.mktemp("bare")
    redis = PrivateRedis(root)
    redis.start()
    prefix = f"{settings.topic_prefix}bare."  # deleted with the run's topics
    port = free_port()
    # Built, not copied: the settings derived from the prefix (collection names) follow it.
    own = Settings(topic_prefix=prefix, data_dir=root / "data", api_port=port, key_file=root / "keys" / "memlane.key",
                   redis_cluster=False, **{"REDIS_URL": redis.url})
    env = stack_env(**{**infra, "MEMLANE_TOPIC_PREFIX": prefix, "MEMLANE_DATA_DIR": str(own.data_dir),
                       "MEMLANE_API_PORT": str(port), "MEMLANE_KEY_FILE": str(own.key_file),
                       "REDIS_URL": redis.url, "MEMLANE_REDIS_CLUSTER": "0"})
    try:
        yield Bare(Stack(env, root / "logs"), own, redis)
    finally:
        redis.stop()


@pytest.fixture
def bare_stack(bare_deployment, tmp_path):
    """A deployment no process runs until a test starts one (its own topics, Redis and data
    directory), shared by the modules that start, kill and restart its processes themselves:
    one test at a time, in BARE_ORDER, its process logs under the test's own `logs`, and every
    process it started stopped when it ends."""
    bare_deployment.stack.log_dir = tmp_path / "logs"
    try:
        yield bare_deployment
    finally:
        bare_deployment.stack.stop()
