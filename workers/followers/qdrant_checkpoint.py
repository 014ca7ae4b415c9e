"""The Qdrant projection's checkpoint: positions to resume from that never pass an event still
parked for its vector, nor a vector read before its event, since a crash would lose either.

The file itself is written by `projections.qdrant.index.write_checkpoint`, after the shard is
flushed (`workers.followers.qdrant_projection`)."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

from projections.qdrant.index import read_checkpoint

PARKED, READ = "_parked", "_read"  # checkpoint entries besides the `topic:partition` positions


def load_checkpoint(path: Path) -> tuple[dict[str, int], dict[str, tuple[int, set[int]]]]:
    """(positions, redo): see `safe_checkpoint`."""
    saved: dict[str, Any] = read_checkpoint(path)
    parked, read = saved.pop(PARKED, {}), saved.pop(READ, {})
    return saved, {part: (end, set(parked.get(part, ()))) for part, end in read.items()}


def safe_checkpoint(
    read: dict[str, int],
    held_events: dict[str, OrderedDict[int, None]],
    held_vectors: dict[str, OrderedDict[int, None]],
    redo: dict[str, tuple[int, set[int]]],
) -> dict[str, Any]:
    """Positions to resume from, given those read (`read`) and the offsets still needed.

    A vector partition resumes at its first held vector. An event partition resumes at
    its first parked event, and the checkpoint lists the parked offsets (`_parked`) and
    where reading had got to (`_read`): events between them were applied and are skipped.
    A range still being redone after a restart carries over what it has not reached."""
    out: dict[str, Any] = dict(read)
    for part, offsets in held_vectors.items():
        if offsets:
            out[part] = min(out.get(part, 0), next(iter(offsets)))
    parked: dict[str, list[int]] = {}
    ends: dict[str, int] = {}
    for part in held_events.keys() | redo.keys():
        pos = read.get(part, 0)
        waiting = list(held_events.get(part, ()))
        end = pos
        if part in redo:
            end = max(pos, redo[part][0])
            waiting += sorted(o for o in redo[part][1] if o >= pos)
        if waiting:
            out[part] = waiting[0]
            parked[part], ends[part] = waiting, end
        else:
            out[part] = end
    if parked:
        out[PARKED], out[READ] = parked, ends
    return out
