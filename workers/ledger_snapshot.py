"""Snapshots of a ledger partition's state, so a recovery folds only the events after one.

A snapshot is the partition's state as a fold of its events up to `next_offset`, kept in
the ledger's data directory, as Kafka Streams keeps a local state store with a checkpoint.
A ledger on another machine, or one whose file is missing, unreadable or stale, folds the
whole partition as before: the event log stays the only source of truth.

`last_sha` is the hash of the event at `next_offset - 1`. A snapshot is used only if that
event is still there, so a topic deleted and made again is never mistaken for the old one.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

import msgspec

from events.config import AgentConfig
from events.rules.ledger import LedgerState
from events.topics import EVENTS
from settings import Settings

# 3: recent commands keyed by tenant, agent and command id; 4: consent, removals, the records of
# each subject, and stats counted per subject; 5: the caller of each recent command, when each
# subject's grant was given and its memory erased, and index keys with length-prefixed parts.
# Older snapshots are folded again.
FORMAT = 5


class _State(msgspec.Struct):
    records: dict[str, bytes]
    index: dict[str, str]
    staged: dict[str, list[str]]
    open_turns: dict[str, dict[str, datetime]]
    turns: dict[str, str]
    turns_before: dict[str, str]
    turns_since: datetime | None
    configs: dict[str, bytes]  # AgentConfig JSON
    stats: dict[str, dict[str, int]]
    # RecentCommands by command key, oldest first: (key, caller, events); caller None when unknown
    recent: list[tuple[str, str | None, list[bytes]]]
    consent: dict[str, bool]
    granted_at: dict[str, datetime]
    erased_at: dict[str, datetime]
    removed_agents: dict[str, bool]
    removed_users: dict[str, bool]
    subject_records: dict[str, tuple[str, ...]]
    blocks: dict[str, dict[str, str]] = {}  # agent -> {label: text}; none in snapshots made before blocks


class Snapshot(msgspec.Struct):
    format: int
    next_offset: int
    last_sha: str
    state: bytes  # a msgpack `_State`, encoded when the snapshot was taken


def sha(event: bytes) -> str:
    return hashlib.sha256(event).hexdigest()


def path_for(settings: Settings, partition: int) -> Path:
    return Path(settings.data_dir) / "ledger" / f"{settings.topic(EVENTS.name)}-{partition}.snapshot"


def encode_state(state: LedgerState, recent: OrderedDict[str, list[bytes]],
                 callers: Mapping[str, str | None] | None = None) -> bytes:
    """The state as it is now: called between batches, when it folds every event sent so far.
    `recent` and `callers` are `RecentCommands.events` and `.callers`."""
    callers = callers or {}
    return msgspec.msgpack.encode(
        _State(
            records=dict(state.records),
            index=dict(state.index),
            staged={k: list(v) for k, v in state.staged.items()},
            open_turns={k: dict(v) for k, v in state.open_turns.items()},
            turns=dict(state.turns),
            turns_before=dict(state.turns_before),
            turns_since=state.turns_since,
            configs={k: c.model_dump_json().encode() for k, c in state.configs.items()},
            stats={k: dict(v) for k, v in state.stats.items()},
            recent=[(k, callers.get(k), v) for k, v in recent.items()],
            blocks={k: dict(v) for k, v in state.blocks.items()},
            consent=dict(state.consent),
            granted_at=dict(state.granted_at),
            erased_at=dict(state.erased_at),
            removed_agents=dict(state.removed_agents),
            removed_users=dict(state.removed_users),
            subject_records={k: tuple(v) for k, v in state.subject_records.items()},
        )
    )


def decode_state(data: bytes) -> tuple[LedgerState, list[tuple[str, str | None, list[bytes]]]]:
    s = msgspec.msgpack.decode(data, type=_State)
    state = LedgerState(
        records=s.records,
        index=s.index,
        staged=s.staged,
        open_turns=s.open_turns,
        turns=s.turns,
        turns_before=s.turns_before,
        turns_since=s.turns_since,
        configs={k: AgentConfig.model_validate_json(v) for k, v in s.configs.items()},
        stats=s.stats,
        blocks=s.blocks,
        consent=s.consent,
        granted_at=s.granted_at,
        erased_at=s.erased_at,
        removed_agents=s.removed_agents,
        removed_users=s.removed_users,
        subject_records=s.subject_records,
    )
    return state, s.recent


def write(path: Path, snapshot: Snapshot) -> None:
    """Atomically: a crash mid-write leaves the previous snapshot, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(msgspec.msgpack.encode(snapshot))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read(path: Path) -> Snapshot | None:
    """The snapshot at `path`, or None when there is none this code can read."""
    try:
        snap = msgspec.msgpack.decode(path.read_bytes(), type=Snapshot)
    except (OSError, msgspec.MsgspecError):
        return None
    return snap if snap.format == FORMAT else None
