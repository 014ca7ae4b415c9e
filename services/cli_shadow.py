"""`memlane shadow`: an agent's recorded turns reviewed again under another extraction prompt or
model, never touching live memory, and what it would decide set beside what live extraction did
(`workers.jobs.shadow`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from settings import get_settings


def add_parsers(sub: Any) -> None:
    s = sub.add_parser("shadow", help="replay an agent's turns under another extraction prompt or model into a "
                       "shadow state, and report how its decisions differ from live extraction's")
    s.add_argument("--tenant", required=True)
    s.add_argument("--agent", required=True)
    s.add_argument("--prompt", required=True, help="file holding the extraction instructions to try")
    s.add_argument("--model", default=None, help="the model to try (default: MEMLANE_MODEL)")
    s.add_argument("--from", dest="start", default=None, help="first turn time, ISO 8601 with offset (default: all)")
    s.add_argument("--to", dest="end", default=None, help="turns before this time (default: up to now)")
    s.add_argument("--name", required=True, help="the run's name: a run of this name goes on where it stopped")
    s.add_argument("--expected", default=None, help="JSON file: {\"<session>/<turn>\": [facts it should keep]} "
                   "to score both policies")
    s.set_defaults(fn=cmd_shadow)


def _time(value: str | None, flag: str) -> datetime | None:
    if value is None:
        return None
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise SystemExit(f"memlane shadow: {flag} must be an ISO 8601 time such as 2026-03-01T00:00:00Z") from None
    if at.tzinfo is None:
        raise SystemExit(f"memlane shadow: {flag} needs its offset from UTC (for example Z)")
    return at


def _read(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SystemExit(f"memlane shadow: cannot read {what} {path}: {type(e).__name__}") from None


def cmd_shadow(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from services.bootstrap import keys_at
    from settings.logging import configure
    from workers.clients.model_client import ModelClient
    from workers.jobs.shadow import RunMismatch, Shadow, ShadowRun, summary
    from workers.runtime.data_keys import open_keys
    from workers.runtime.kafka_io import wait_for_broker

    settings = get_settings()
    configure(settings.log_level, service="cli")
    if args.model:
        settings = settings.model_copy(update={"model": args.model})
    if not settings.model_configured:
        print("memlane shadow: no model configured; set OPENAI_BASE_URL and/or OPENAI_API_KEY", file=sys.stderr)
        return 2
    prompt = _read(args.prompt, "the prompt")
    expected = json.loads(_read(args.expected, "the expected facts")) if args.expected else None
    run = ShadowRun(args.name, args.tenant, args.agent, prompt, settings.model, _time(args.start, "--from"),
                    _time(args.end, "--to"))
    codec = keys_at(settings)()

    async def go() -> list[dict[str, Any]]:
        await wait_for_broker(settings)
        keys = await open_keys(settings, codec, follow=False)
        model = ModelClient(settings)
        bar = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn(), console=Console(stderr=True))  # the report goes to standard output
        task = bar.add_task(f"shadow {args.name}", total=None)
        try:
            with bar:
                shadow = Shadow(settings, codec, keys, model, Path(settings.data_dir) / "shadow")
                return await shadow.run(run, lambda done, total: bar.update(task, completed=done, total=total))
        finally:
            await model.close()
            if keys is not None:
                await keys.stop()

    try:
        lines = asyncio.run(go())
    except RunMismatch as e:
        print(f"memlane shadow: {e}", file=sys.stderr)
        return 2
    for x in lines:
        if x["differs"]:
            print(json.dumps({"turn": x["turn"], "live": x["live"], "shadow": x["shadow"],
                              **({"error": x["error"]} if "error" in x else {})}))
    print(json.dumps({"summary": summary(lines, expected)}))
    return 0
