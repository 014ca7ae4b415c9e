from __future__ import annotations

import uuid

import pytest

from events import AgentConfig
from services.client import MemlaneClient, TurnPublisher
from services.stack import Stack, stack_env
from tests.fakes.model_server import FakeModel


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


@pytest.fixture(scope="module")
def fake():
    """The scripted OpenAI-compatible model server, one per test module."""
    f = FakeModel().start()
    yield f
    f.stop()
