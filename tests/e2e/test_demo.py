"""`memlane demo` (what `make demo` runs): its own stack, a sample conversation, what it stored and found."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
from pathlib import Path

from services.demo import CONVERSATION
from services.stack import free_port, stack_env
from settings import ROOT, Settings
from workers.runtime.kafka_io import delete_prefixed_topics


def test_memlane_demo_stores_the_committed_turns_and_finds_them(settings, infra):
    # Its own API port; COLUMNS keeps rich from wrapping the table and the search lines.
    env = stack_env(MEMLANE_API_PORT=str(free_port()), COLUMNS="200", **infra)
    memlane = Path(sys.executable).with_name("memlane")
    proc = subprocess.run([str(memlane), "demo"], env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout
    run = re.search(r"\.run/(demo\d+)/logs", out)
    try:
        assert proc.returncode == 0, (out + proc.stderr)[-3000:]
        committed = [memory for _, _, memory, ok in CONVERSATION if ok]
        rolled_back = [memory for _, _, memory, ok in CONVERSATION if not ok]
        assert f"{len(committed)} records stored" in out
        table = out[out.index("records stored"):out.index("search (")]
        assert all(m in table for m in committed) and not any(m in table for m in rolled_back)
        found = dict(re.findall(r"search \(\w+\) '([^']+)' -> (.+?)(?:  \(score -?[\d.]+\))?$", out, re.M))
        assert found == {
            "where is the user based?": "The user is Dana, who runs the payments team in Lisbon.",
            "SETL-2291": "Settlement batch ID is SETL-2291.",
            "how should answers be formatted?": "Dana prefers short bullet-list answers.",
            "Banco Azul": "nothing",  # only the rolled-back turn said it
        }, out
        assert "stopped the processes the demo started" in out
    finally:
        if run:  # the demo keeps its topics and files, as `make demo` leaves them to look at
            prefix = f"{run.group(1)}."
            asyncio.run(delete_prefixed_topics(Settings(topic_prefix=prefix), prefix))
            shutil.rmtree(ROOT / ".run" / run.group(1), ignore_errors=True)
