"""`make bench [ONLY=<group>]`: one JSON line per figure on stdout, progress on stderr."""

from __future__ import annotations

import importlib
import sys

import uvloop

GROUPS = {
    "pipeline": "tests.bench.bench_pipeline",
    "rebuild": "tests.bench.bench_rebuild",
    "extraction": "tests.bench.bench_extraction",
    "consolidation": "tests.bench.bench_consolidation",
    "recall": "tests.bench.bench_recall",
    "merge": "tests.bench.bench_merge",
    "history": "tests.bench.bench_history",
    "notes": "tests.bench.bench_notes",
    "chaos": "tests.bench.bench_chaos",
    "encryption": "tests.bench.bench_encryption",
    "web": "tests.bench.bench_web",
    "ops": "tests.bench.bench_ops",
    "writes": "tests.bench.bench_writes",
    "scale": "tests.bench.bench_scale",
    "apikeys": "tests.bench.bench_api_keys",
    "fairness": "tests.bench.bench_fairness",
    "redisloss": "tests.bench.bench_redis_loss",
    "timetravel": "tests.bench.bench_timetravel",
    "ecosystem": "tests.bench.bench_ecosystem",
}


def main(argv: list[str]) -> int:
    only = [a for a in argv if a]
    unknown = [g for g in only if g not in GROUPS]
    if unknown:
        print(f"unknown bench group(s) {unknown}; choose from {sorted(GROUPS)}", file=sys.stderr)
        return 2
    for name in only or GROUPS:
        module = importlib.import_module(GROUPS[name])
        # uvloop, as memlane's own processes use: the bench's publisher, readers and fake
        # model share the machine's cores with what they measure.
        uvloop.run(module.run())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
