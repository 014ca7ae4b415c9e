"""Turn `make bench` output into docs/benchmarks.md: a Markdown table of the figures, with the
date and the machine they were taken on.

`make bench` prints one JSON line per figure (`tests/bench/common.py`, `figure`):
`{"figure": ..., "value": ..., "unit": ..., "n": ..., "cores": ..., **extra}`. This reads those
lines from the file named on the command line, or from stdin, and prints the page:

    make bench ONLY=recall | tee /tmp/bench.jsonl
    .venv/bin/python -m tests.bench.report /tmp/bench.jsonl > docs/benchmarks.md

Lines that are not a JSON object with a "figure" (a stray log line) are skipped, and the page
says how many. The machine is this one: its core count, CPU model (/proc/cpuinfo) and Python
version, so run it where the bench ran. Standard library only.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

COLUMNS = ("figure", "value", "unit", "n", "cores")


def read_figures(lines: Iterable[str]) -> tuple[list[dict[str, Any]], int]:
    """The figures among `lines`, in order, and how many non-blank lines were not figures."""
    figures: list[dict[str, Any]] = []
    skipped = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            skipped += 1
            continue
        if isinstance(item, dict) and "figure" in item:
            figures.append(item)
        else:
            skipped += 1
    return figures, skipped


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name as Linux reports it, else what `platform` knows."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine() -> str:
    return f"{os.cpu_count()} cores, {cpu_model()}, Python {platform.python_version()}"


def cell(value: Any) -> str:
    """One table cell: numbers and text as they are, lists and objects as compact JSON."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "))
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def render(figures: list[dict[str, Any]], skipped: int, date: str, where: str) -> str:
    """The page: a heading, the date and the machine, and one row per figure (extra keys last)."""
    out = [
        "# Benchmarks",
        "",
        f"`make bench` figures of {date}, written by `python -m tests.bench.report` "
        "([reference/testing.md](reference/testing.md#benchmarks) says what each group measures).",
        "",
        f"Machine: {where}.",
        "",
        "| figure | value | unit | n | cores | other |",
        "|---|---|---|---|---|---|",
    ]
    for f in figures:
        extra = "; ".join(f"{k}: {cell(v)}" for k, v in f.items() if k not in COLUMNS)
        out.append("| " + " | ".join([f"`{cell(f.get('figure'))}`", *(cell(f.get(k)) for k in COLUMNS[1:]),
                                      extra]) + " |")
    if skipped:
        out += ["", f"Input lines that were not figures, left out: {skipped}."]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1 or (args and args[0] in ("-h", "--help")):
        print(__doc__, file=sys.stderr)
        return 2
    if args and args[0] != "-":
        with open(args[0], encoding="utf-8") as f:
            figures, skipped = read_figures(f)
    else:
        figures, skipped = read_figures(sys.stdin)
    if not figures:
        print("no figures in the input (JSON lines with a \"figure\" key)", file=sys.stderr)
        return 1
    sys.stdout.write(render(figures, skipped, datetime.now(UTC).date().isoformat(), machine()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
