"""Keep Python's cycle collector off a fold's long-lived state."""

from __future__ import annotations

import gc


def settle_heap() -> None:
    """Call between batches of a long fold.

    What survived the batch is mostly the fold's state (versions, vectors, records), which
    only grows. Without this, the collector's full passes rescan all of it again and again:
    that was half the time of a 100k-record rebuild. A batch's own garbage cycles are
    collected first, so freezing leaks nothing that was already unreachable.
    """
    gc.collect(1)
    gc.freeze()
