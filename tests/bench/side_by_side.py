"""`make bench-ab REF=<commit> ONLY=<group> [ROUNDS=n]`: a bench group run alternately on the code
of `REF` and on this checkout, on the same broker and Redis, with the median of each figure
per side and their ratio at the end.

A machine's load drifts over minutes, so only figures taken in one run, side by side, compare.
`REF`'s checkout is a git worktree under `.run/side-by-side/<REF>` (kept between runs), given
this checkout's keys; its own bench module runs there, so a figure it does not print has no
ratio. Progress goes to stderr; the figures, each tagged with its side, and the summary to stdout.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from settings import ROOT


def checkout(ref: str) -> Path:
    """A worktree of `ref`, with this checkout's keys (a stack seals with them)."""
    where = ROOT / ".run" / "side-by-side" / ref
    if not where.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--force", "--detach", str(where), ref],
                       check=True, stdout=subprocess.DEVNULL)
    keys = ROOT / ".run" / "keys"
    if keys.exists():
        shutil.copytree(keys, where / ".run" / "keys", dirs_exist_ok=True)
    return where


def run_side(where: Path, group: str) -> list[dict]:
    """The group's figures from one run of the bench module in `where`."""
    out = subprocess.run([sys.executable, "-m", "tests.bench", group], cwd=where, stdout=subprocess.PIPE,
                         text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{") and '"figure"' in line]


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m tests.bench.side_by_side REF GROUP [ROUNDS]", file=sys.stderr)
        return 2
    ref, group, rounds = argv[0], argv[1], int(argv[2]) if len(argv) > 2 else 1
    sides = {ref: checkout(ref), "this": ROOT}
    values: dict[tuple[str, str], list[float]] = defaultdict(list)
    for n in range(rounds):
        for side, where in sides.items():
            print(f"[side-by-side] round {n + 1}/{rounds}: {group} on {side}", file=sys.stderr, flush=True)
            for f in run_side(where, group):
                values[f["figure"], side].append(f["value"])
                print(json.dumps({"side": side, **f}), flush=True)
    for name in dict.fromkeys(name for name, _ in values):
        old, new = values.get((name, ref)), values.get((name, "this"))
        summary = {"figure": name, "side": "summary", ref: old and statistics.median(old),
                   "this": new and statistics.median(new), "runs": rounds}
        if old and new and statistics.median(old):
            summary["ratio"] = round(statistics.median(new) / statistics.median(old), 3)
        print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
