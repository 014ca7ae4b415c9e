"""The process environment beyond `Settings`: what the CLI's client commands read, and the
environment a process hands the children it starts. The only other place that reads it."""

from __future__ import annotations

import os

from pydantic_settings import BaseSettings, SettingsConfigDict

from settings import ROOT


class ClientEnvironment(BaseSettings):
    """What `memlane mcp` and `memlane keys` take from the environment when no flag gives it:
    the caller's key and the agent's session, member, channel and origin."""

    model_config = SettingsConfigDict(env_prefix="MEMLANE_", extra="ignore")

    api_key: str = ""
    session: str = ""
    user: str = ""
    channel: str = ""
    execution_id: str = ""
    # Whole numbers, checked where they are used so the error names the flag too.
    invocation: str = ""
    agent_version: str = ""


def child_environment(**overrides: str) -> dict[str, str]:
    """This process's environment with `overrides`, and the checkout importable, for a child
    process it starts."""
    env = dict(os.environ)
    env.update(overrides)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env
