"""The `memlane` command: start workers, serve the API, replay, rebuild, demo."""

from __future__ import annotations

import argparse
import asyncio
import sys

from services.logging import configure
from services.settings import get_settings

WORKERS = {
    "extraction": "workers.extraction:ExtractionProcessor",
    "ledger": "workers.ledger:LedgerProcessor",
    "embedding": "workers.embedding:EmbeddingWorker",
    "redis-projection": "workers.redis_projection:RedisProjection",
}


def _load(path: str):
    mod, _, name = path.partition(":")
    module = __import__(mod, fromlist=[name])
    return getattr(module, name)


def cmd_worker(args: argparse.Namespace) -> int:
    from workers.runtime import run_processor

    settings = get_settings()
    configure(settings.log_level, service=f"worker.{args.name}")
    processor = _load(WORKERS[args.name])(settings)
    asyncio.run(run_processor(processor, settings))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from services.api import build_app

    settings = get_settings()
    configure(settings.log_level, service="api")
    host = args.host or settings.api_host
    port = args.port or settings.api_port
    uvicorn.run(build_app(settings), host=host, port=port, log_config=None, access_log=False)
    return 0


def cmd_topics(args: argparse.Namespace) -> int:
    from workers.kafka_io import ensure_topics, wait_for_broker

    settings = get_settings()
    configure(settings.log_level, service="cli")

    async def go():
        await wait_for_broker(settings)
        await ensure_topics(settings)

    asyncio.run(go())
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from services.demo import run_demo

    return run_demo()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="memlane", description="Event-sourced long-term memory for LLM agents.")
    sub = parser.add_subparsers(dest="command", required=True)

    w = sub.add_parser("worker", help="run one stream worker (scale each on its own)")
    w.add_argument("name", choices=sorted(WORKERS), help="which worker to run")
    w.set_defaults(fn=cmd_worker)

    s = sub.add_parser("serve", help="serve the HTTP API and the Qdrant projection of its shard")
    s.add_argument("--host", default=None)
    s.add_argument("--port", type=int, default=None)
    s.set_defaults(fn=cmd_serve)

    t = sub.add_parser("topics", help="create memlane's topics (workers also do this on start)")
    t.set_defaults(fn=cmd_topics)

    d = sub.add_parser("demo", help="start everything, store a sample conversation, search it, stop")
    d.set_defaults(fn=cmd_demo)

    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        return 130
    except RuntimeError as e:
        print(f"memlane: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
