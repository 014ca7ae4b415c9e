"""`memlane undo`: take back what a command, a turn or a session wrote, through the API as an
operator; it shows the plan first and asks before it writes."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from settings import get_settings


def add_parsers(sub: Any) -> None:
    u = sub.add_parser("undo", help="take back what a command, a turn or a session wrote to an agent's memory "
                       "(shows the plan, then asks)")
    u.add_argument("--tenant", required=True)
    u.add_argument("--agent", required=True)
    what = u.add_mutually_exclusive_group(required=True)
    what.add_argument("--command", dest="command_id", help="a command id (an undo's own id undoes the undo)")
    what.add_argument("--turn", help="a turn: <session>/<turn number>")
    what.add_argument("--session", help="a session id")
    u.add_argument("--force", action="store_true", help="also take back later writes of others to the same records")
    u.add_argument("--yes", action="store_true", help="do not ask before writing")
    u.add_argument("--key-file", default=None, help="file holding an operator key (default: MEMLANE_API_KEY, else "
                   "the deployment's operator key)")
    u.add_argument("--api-url", default=None, help="memlane API (default: MEMLANE_API_URL)")
    u.set_defaults(fn=cmd_undo)


def cmd_undo(args: argparse.Namespace) -> int:
    import httpx

    from services.cli_clients import admin_key

    settings = get_settings()
    api_url = (args.api_url or settings.api_url).rstrip("/")
    headers = {"Authorization": f"Bearer {admin_key(args, settings, 'undo')}", "X-Tenant": args.tenant,
               "X-Agent": args.agent}
    target = {k: v for k, v in (("command_id", args.command_id), ("turn", args.turn), ("session", args.session)) if v}

    async def call(**flags: bool) -> httpx.Response:
        async with httpx.AsyncClient(base_url=api_url, headers=headers, timeout=60) as http:
            return await http.post("/v1/undo", json={**target, "force": args.force, **flags})

    def refused(resp: httpx.Response) -> int:
        err = resp.json().get("error", {})
        where = f" (field {err.get('field')})" if err.get("field") else ""
        print(f"memlane undo: {resp.status_code} {err.get('code')}{where}: {err.get('message')}", file=sys.stderr)
        return 1

    try:
        preview = asyncio.run(call(preview=True))
        if preview.status_code != 200:
            return refused(preview)
        plan = preview.json()
        if plan["members_records_left"]:
            print(f"left as they are: {plan['members_records_left']} records naming a member (theirs to delete)")
        if not plan["changes"]:
            print(f"nothing to undo: the {plan['unchanged']} records it changed are as they were before it")
            return 0
        for c in plan["changes"]:
            pin = ", pinned" if c["pinned"] else ""
            print(f"record {c['record_id']} (now version {c['expected_version']}) -> {c['status']}{pin}")
        for d in plan["dependents"]:
            print(f"depends on it: {d}" + ("; taken back too (--force)" if args.force else ""))
        if plan["dependents"] and not args.force:
            print("memlane undo: later writes depend on what this takes back; undo them first, or pass --force",
                  file=sys.stderr)
            return 1
        if not args.yes:
            if not sys.stdin.isatty():
                print("memlane undo: pass --yes to write the undo", file=sys.stderr)
                return 2
            if input(f"take back {len(plan['changes'])} records' changes? [y/N] ").strip().lower() not in ("y", "yes"):
                print("nothing written")
                return 1
        done = asyncio.run(call())
    except httpx.HTTPError as e:
        print(f"memlane undo: cannot reach the API at {api_url} ({type(e).__name__})", file=sys.stderr)
        return 1
    if done.status_code != 200:
        return refused(done)
    out = done.json()
    print(json.dumps({"undo_command_id": out["undo_command_id"], "records": len(out["changes"]),
                      "status": out["status"]}))
    print(f"undone; to take this back: memlane undo --tenant {args.tenant} --agent {args.agent} "
          f"--command {out['undo_command_id']}", file=sys.stderr)
    return 0
