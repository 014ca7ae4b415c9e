"""Whether a process is running, by its id."""

from __future__ import annotations

import os


def running(pid: int) -> bool:
    """A process that exists but is another user's counts as running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
