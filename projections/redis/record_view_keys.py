"""The record view's key layout: every key of an agent is named in its generation namespace
and carries the agent as a hash tag, so the agent's keys share one Redis Cluster slot."""

from __future__ import annotations

from typing import Any

from projections.redis import profile_view
from projections.redis.connection import agent_tag, scan_keys

APPLY_KINDS = ("rec", "list", "pinned", "shadowed", "users", "expiry")  # APPLY's KEYS, in order
AGENT_KINDS = (*APPLY_KINDS, "blocks", "consent", "usage",  # what dropping an agent unlinks, with its member listings
               profile_view.PROFILE_KIND)
REMOVED_TENANTS = "removed_tenants"  # `<ns>:removed_tenants`: tenants removed and not restored
PAGE = 1000  # keys, fields or members per SCAN page and per write when a purge walks a key


def agent_key(ns: str, kind: str, ak: str) -> str:
    """An agent's key of `kind` in generation namespace `ns`, tagged with the agent."""
    return f"{ns}:{kind}:{agent_tag(ak)}"


def user_list_prefix(ns: str, ak: str) -> str:
    """What the agent's member listings start with: APPLY appends the member."""
    return f"{agent_key(ns, 'ulist', ak)}|"


def user_list_key(ns: str, ak: str, user: str) -> str:
    """The member's listing of their USER records on the agent."""
    return user_list_prefix(ns, ak) + user


def apply_keys(ns: str, ak: str) -> list[str]:
    return [agent_key(ns, kind, ak) for kind in APPLY_KINDS]


async def tagged_agents(client: Any, ns: str, kind: str, tenant: str) -> set[str]:
    """The agents of `tenant` that have a key of `kind` (`<ns>:<kind>:{<tenant>/<agent>}`),
    every primary's on a cluster."""
    prefix = f"{ns}:{kind}:{{{tenant}/"
    return {k[len(prefix):-1] async for k in scan_keys(client, f"{prefix}*}}", count=PAGE)}
