"""`memlane export` and `memlane import`: an agent's memory as a portable file, through the API
as a client, so an export holds only what its key may read and an import goes through the same
checks as any write (`events.rules.portable`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from settings import get_settings

CONCURRENT_WRITES = 32  # an import's writes in flight at once; each waits for the ledger's answer


def add_parsers(sub: Any) -> None:
    e = sub.add_parser("export", help="write what a key may read of an agent's memory to a JSON-lines file: "
                       "records with every version, blocks, the member's profile and notes")
    e.add_argument("--tenant", default=None, help="the tenant (an operator key; a member or agent key knows its own)")
    e.add_argument("--agent", required=True)
    e.add_argument("--user", default=None, help="the member whose memory to include (sent as X-User)")
    e.add_argument("--out", default="-", help="the file to write (default: standard output)")
    i = sub.add_parser("import", help="load a memlane export, or a Mem0 export (JSON), into an agent as writes "
                       "the ledger checks; running it again writes nothing twice")
    i.add_argument("file", help="the export to load")
    i.add_argument("--tenant", default=None, help="the tenant (an operator key; an agent key knows its own)")
    i.add_argument("--agent", required=True)
    i.add_argument("--dry-run", action="store_true", help="check the file and print what would be written")
    for p in (e, i):
        p.add_argument("--key-file", default=None, help="file holding the API key (default: MEMLANE_API_KEY, "
                       "else the deployment's operator key)")
        p.add_argument("--api-url", default=None, help="memlane API (default: MEMLANE_API_URL)")
    e.set_defaults(fn=cmd_export)
    i.set_defaults(fn=cmd_import)


def _bar(label: str, total: int | None) -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    # On standard error: standard output is the export's, or the caller's to pipe.
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True))
    return bar, bar.add_task(label, total=total)


def cmd_export(args: argparse.Namespace) -> int:
    import httpx

    from services.cli_clients import admin_key

    settings = get_settings()
    api_url = (args.api_url or settings.api_url).rstrip("/")
    key = admin_key(args, settings, "export")
    headers = {"Authorization": f"Bearer {key}", "X-Agent": args.agent}
    headers |= {"X-Tenant": args.tenant} if args.tenant else {}
    headers |= {"X-User": args.user} if args.user else {}
    out = sys.stdout if args.out == "-" else open(args.out, "w", encoding="utf-8")  # noqa: SIM115
    bar, task = _bar("exporting", None)
    counts: dict[str, int] = {}

    async def go() -> int:
        async with httpx.AsyncClient(timeout=60) as http, http.stream("GET", f"{api_url}/v1/export",
                                                                        headers=headers) as resp:
            if resp.status_code != 200:
                try:
                    err = json.loads(await resp.aread()).get("error", {})
                except ValueError:
                    err = {"message": "the answer was not JSON"}
                where = f" (field {err.get('field')})" if err.get("field") else ""
                print(f"memlane export: {resp.status_code} {err.get('code')}{where}: {err.get('message')}",
                      file=sys.stderr)
                return 1
            with bar:
                async for line in resp.aiter_lines():
                    if line:
                        out.write(line + "\n")
                        kind = json.loads(line)["type"]
                        counts[kind] = counts.get(kind, 0) + 1
                        bar.update(task, advance=1)
        if "end" not in counts:
            print("memlane export: the export was cut short (no end line); run it again", file=sys.stderr)
            return 1
        return 0

    try:
        code = asyncio.run(go())
    except httpx.HTTPError as e:
        print(f"memlane export: the API at {api_url} did not answer in full ({type(e).__name__}); run it again",
              file=sys.stderr)
        code = 1
    finally:
        if out is not sys.stdout:
            out.close()
    if code != 0 and args.out != "-":
        Path(args.out).unlink(missing_ok=True)  # never leave a partial file that looks like an export
    if code == 0:
        what = ", ".join(f"{n} {k}s" for k, n in counts.items() if k not in ("header", "end")) or "nothing"
        print(f"exported {what} of {args.agent}" + (f" to {args.out}" if args.out != "-" else ""), file=sys.stderr)
    return code


def cmd_import(args: argparse.Namespace) -> int:
    import httpx

    from events.rules import portable
    from services.cli_clients import admin_key
    from services.client import MemlaneClient, MemlaneError

    settings = get_settings()
    api_url = args.api_url or settings.api_url
    try:
        text = Path(args.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        print(f"memlane import: cannot read {args.file}: {type(e).__name__}", file=sys.stderr)
        return 2
    try:
        parsed = portable.parse(text, args.tenant or "", args.agent)
    except json.JSONDecodeError as e:
        print(f"memlane import: {args.file} is not a memlane or Mem0 export ({e.msg} at line {e.lineno})",
              file=sys.stderr)
        return 2
    refused = list(parsed.refused)
    if args.dry_run:
        for w in parsed.writes:
            print(json.dumps({"line": w.line, "command_id": w.command_id, "user": w.user, **w.fields}))
        for r in refused:
            print(f"memlane import: refused {r}", file=sys.stderr)
        return 0 if not refused else 1
    key = admin_key(args, settings, "import")
    written = restated = 0
    bar, task = _bar(f"importing {parsed.kind}", len(parsed.writes))

    async def go() -> None:
        nonlocal written, restated
        clients: dict[tuple[str | None, str | None], MemlaneClient] = {}
        gate = asyncio.Semaphore(CONCURRENT_WRITES)

        def client(user: str | None, session: str | None) -> MemlaneClient:
            c = clients.get((user, session))
            if c is None:
                c = clients[user, session] = MemlaneClient(api_url, key, tenant=args.tenant, agent=args.agent,
                                                           user=user, session=session)
            return c

        async def one(w: portable.Write) -> None:
            nonlocal written, restated
            c = client(w.user, w.session)
            fields = dict(w.fields)
            async with gate:
                try:
                    answer = await c.add_memory(fields.pop("summary"), command_id=w.command_id, **fields)
                    written += 1
                    restated += bool(answer.get("merged"))  # the agent held it already, from elsewhere
                except MemlaneError as e:
                    refused.append(portable.Refusal(w.line, e.field or "$", f"{e.code}: {e.message}"))
            bar.update(task, advance=1)

        async def block(b: portable.BlockLine) -> None:
            async with gate:
                try:
                    await client(None, None).curate_block(b.label, "add", line=b.text, scope=b.scope,
                                                          application=b.application)
                except MemlaneError as e:
                    refused.append(portable.Refusal(b.line, e.field or "$", f"{e.code}: {e.message}"))

        async def profile(p: portable.ProfileWrite) -> None:
            try:
                await client(p.user, None).write_profile(p.user, p.text)
            except MemlaneError as e:
                refused.append(portable.Refusal(p.line, e.field or "$", f"{e.code}: {e.message}"))

        try:
            with bar:
                await asyncio.gather(*(one(w) for w in parsed.writes))
                for b in parsed.blocks:  # in order: a block's lines keep theirs
                    await block(b)
                await asyncio.gather(*(profile(p) for p in parsed.profiles))
        finally:
            for c in clients.values():
                await c.aclose()

    try:
        asyncio.run(go())
    except httpx.HTTPError as e:
        print(f"memlane import: cannot reach the API at {api_url} ({type(e).__name__}); run it again: what was "
              "written is not written twice", file=sys.stderr)
        return 1
    for r in sorted(refused, key=lambda r: r.line):
        print(f"memlane import: refused {r}", file=sys.stderr)
    print(f"imported {written} of {len(parsed.writes)} memories from {args.file} ({parsed.kind}) into {args.agent} "
          f"({restated} restating a record it held), {len(parsed.blocks)} block lines and {len(parsed.profiles)} "
          f"profiles; {len(refused)} refused, {parsed.skipped} not live records or notes", file=sys.stderr)
    return 0 if not refused else 1
