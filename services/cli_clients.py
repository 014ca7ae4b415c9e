"""The `memlane` commands that call the API as a client: `mcp` (the memory tools over stdio for
one agent key) and `keys` (a tenant's API keys, as an operator)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from settings import get_settings
from settings.environment import ClientEnvironment


def add_parsers(sub: Any) -> None:
    m = sub.add_parser("mcp", help="serve the memory tools over MCP (stdio) for one agent key")
    m.add_argument("--key", default=None, help=argparse.SUPPRESS)  # refused: see cmd_mcp
    m.add_argument("--key-file", default=None, help="file holding the agent's API key (default: MEMLANE_API_KEY)")
    m.add_argument("--session", default=None, help="session id (default: MEMLANE_SESSION)")
    m.add_argument("--user", default=None, help="the member the session belongs to, sent as X-User "
                   "(default: MEMLANE_USER)")
    m.add_argument("--channel", default=None, help="the session's channel, sent as X-Channel "
                   "(default: MEMLANE_CHANNEL)")
    m.add_argument("--execution-id", default=None, help="the execution the session's writes come from, "
                   "kept in their provenance (default: MEMLANE_EXECUTION_ID)")
    m.add_argument("--invocation", default=None, help="the invocation of that execution (default: MEMLANE_INVOCATION)")
    m.add_argument("--agent-version", default=None, help="the agent version (default: MEMLANE_AGENT_VERSION)")
    m.add_argument("--api-url", default=None, help="memlane API (default: MEMLANE_API_URL)")
    m.set_defaults(fn=cmd_mcp)

    k = sub.add_parser("keys", help="issue, list or revoke a tenant's API keys (an operator key: --key-file, "
                       "MEMLANE_API_KEY, or MEMLANE_OPERATOR_KEY)")
    ksub = k.add_subparsers(dest="action", required=True)
    ki = ksub.add_parser("issue", help="issue a key; prints it once, with its entry")
    ki.add_argument("--tenant", required=True)
    ki.add_argument("--agent", default=None, help="the agent it speaks for (a member key: none for every agent)")
    ki.add_argument("--role", choices=["agent", "helper", "operator", "member"], default="agent")
    ki.add_argument("--user", default=None, help="a member key's member (role member only)")
    kl = ksub.add_parser("list", help="the tenant's keys, never a key")
    kl.add_argument("--tenant", default=None)
    kr = ksub.add_parser("revoke", help="revoke a key by its id, at once")
    kr.add_argument("id")
    kr.add_argument("--tenant", default=None)
    for p in (ki, kl, kr):
        p.add_argument("--key-file", default=None, help="file holding an operator key")
        p.add_argument("--api-url", default=None, help="memlane API (default: MEMLANE_API_URL)")
        p.set_defaults(fn=cmd_keys)


def _mcp_key(args: argparse.Namespace) -> str | None:
    """The key from --key-file or MEMLANE_API_KEY: never from argv, which every user of the
    machine can read in the process list."""
    if args.key_file:
        try:
            return open(args.key_file, encoding="utf-8").read().strip() or None
        except (OSError, UnicodeDecodeError) as e:
            raise SystemExit(f"memlane mcp: cannot read --key-file: {type(e).__name__}") from None
    return ClientEnvironment().api_key or None


def cmd_mcp(args: argparse.Namespace) -> int:
    import httpx

    from services.client import MemlaneError
    from services.mcp_server import StartRefused, run_stdio

    settings = get_settings()
    if args.key is not None:
        print("memlane mcp: --key would show the key in the process list; set MEMLANE_API_KEY or pass --key-file",
              file=sys.stderr)
        return 2
    key = _mcp_key(args)
    if not key:
        print("memlane mcp: set MEMLANE_API_KEY, or pass --key-file, to the agent's API key", file=sys.stderr)
        return 2
    api_url = args.api_url or settings.api_url
    env = ClientEnvironment()
    origin: dict[str, Any] = {"execution_id": args.execution_id or env.execution_id or None}
    for name, flag, variable in (("invocation", args.invocation, "MEMLANE_INVOCATION"),
                                 ("agent_version", args.agent_version, "MEMLANE_AGENT_VERSION")):
        raw = flag if flag is not None else getattr(env, name)
        if raw:
            if not raw.isdigit():
                print(f"memlane mcp: {name} (--{name.replace('_', '-')} or {variable}) is {raw!r}; give a "
                      "whole number of 0 or more", file=sys.stderr)
                return 2
            origin[name] = int(raw)
    try:
        run_stdio(api_url, key, args.session or env.session or None, args.user or env.user or None,
                  args.channel or env.channel or None, origin)
    except StartRefused as e:
        print(f"memlane mcp: {e}", file=sys.stderr)
        return 2
    except MemlaneError as e:
        hint = "; the key is unknown or revoked" if e.status == 401 else ""
        where = f" (field {e.field}): {e.message}" if e.status != 401 and e.field else ""
        print(f"memlane mcp: the API refused the key ({e.status} {e.code}){hint}{where}", file=sys.stderr)
        return 1
    except httpx.HTTPError as e:
        print(f"memlane mcp: cannot reach the API at {api_url} ({type(e).__name__})", file=sys.stderr)
        return 1
    return 0


def admin_key(args: argparse.Namespace, settings, command: str = "keys") -> str:
    """A key from --key-file or MEMLANE_API_KEY, else the deployment's MEMLANE_OPERATOR_KEY."""
    if args.key_file:
        try:
            return open(args.key_file, encoding="utf-8").read().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise SystemExit(f"memlane {command}: cannot read --key-file: {type(e).__name__}") from None
    return ClientEnvironment().api_key or settings.operator_key


def cmd_keys(args: argparse.Namespace) -> int:
    """Issue, list or revoke a tenant's API keys through the API, as an operator."""
    import json

    import httpx

    from services.client import MemlaneClient, MemlaneError

    settings = get_settings()
    api_url = args.api_url or settings.api_url

    async def go() -> object:
        async with MemlaneClient(api_url, admin_key(args, settings)) as c:
            if args.action == "issue":
                return await c.issue_key_entry(args.tenant, args.agent, args.role, args.user)
            if args.action == "list":
                return await c.list_keys(args.tenant)
            return await c.revoke_key(args.id, args.tenant)

    try:
        out = asyncio.run(go())
    except MemlaneError as e:
        where = f" (field {e.field})" if e.field else ""
        print(f"memlane keys {args.action}: {e.status} {e.code}{where}: {e.message}", file=sys.stderr)
        return 2 if e.status == 422 else 1
    except httpx.HTTPError as e:
        print(f"memlane keys: cannot reach the API at {api_url} ({type(e).__name__})", file=sys.stderr)
        return 1
    print(json.dumps(out, indent=2))
    return 0
