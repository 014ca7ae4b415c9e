"""Named points where a process can be made to kill itself, so a crash test lands at the exact
moment it means instead of racing a burst (docs/reference/testing.md).

`MEMLANE_FAULT_AT=<point>` or `<point>@<n>`: the process sends itself SIGKILL the n-th time
(default the first) it reaches that point. Unset, `reached` is one string comparison.
"""

from __future__ import annotations

import os
import signal

# The points: a stream worker's `<worker>.before_commit` (outputs sent, the transaction not yet
# committed) and `<worker>.after_commit` (the batch committed, the next poll not begun), and the
# memory index's `memory_index.checkpoint_with_parked` (a checkpoint saved while events still
# wait for their vectors; the API's process holds the index).
AFTER_COMMIT, BEFORE_COMMIT = "after_commit", "before_commit"
INDEX_CHECKPOINT_WITH_PARKED = "memory_index.checkpoint_with_parked"


class Faults:
    def __init__(self, spec: str | None) -> None:
        point, _, n = (spec or "").partition("@")
        self.point = point or None
        self.after = int(n) if n else 1
        if self.after < 1:
            raise ValueError(f"MEMLANE_FAULT_AT: the count after @ must be 1 or more, not {n}")
        self.seen = 0

    def armed(self, point: str) -> bool:
        """Whether this process is to die at `point`: the code may hurry to reach it."""
        return point == self.point

    def reached(self, point: str) -> None:
        if point != self.point:
            return
        self.seen += 1
        if self.seen >= self.after:
            os.kill(os.getpid(), signal.SIGKILL)
