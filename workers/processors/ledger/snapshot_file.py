"""Snapshots of a ledger partition's state, so a recovery folds only the events after one.

A snapshot is the partition's state as a fold of its events up to `next_offset`, kept in
the ledger's data directory, as Kafka Streams keeps a local state store with a checkpoint.
A ledger on another machine, or one whose file is missing, unreadable or stale, folds the
whole partition as before: the event log stays the only source of truth.

`last_sha` is the hash of the event at `next_offset - 1`. A snapshot is used only if that
event is still there, so a topic deleted and made again is never mistaken for the old one.

With a cipher (the ledger's codec's) a snapshot holds no plaintext: the records are
sealed under their subject's key (the member's for a USER record, else the agent's, as their
events are), all of a subject's records in one token; each staged write under its member's
key (else its agent's) and each block text under its agent's. Recent commands' events are kept
as they were logged, sealed. An entry whose key was destroyed since (its subject was erased)
does not open: reading the snapshot drops it, and counts it. The uniqueness index holds hashes
of texts and of record keys only, and is sealed too, each entry under the key of the record it
names: without the key no one can test a guessed text against a hash.

Why a token per subject rather than per record: sealing each record's fields cost five times
as much, on the ledger's event loop, and a subject's records are erased together anyway.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from collections.abc import Callable, Mapping, MutableMapping
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import msgspec

from events.codec import ContractError
from events.config import AgentConfig
from events.rules.ledger import LedgerState, drop_records, restage
from events.sealing import Cipher, KeyDestroyed, KeyMissing, agent_subject, open_text, seal_text, subject_of
from events.topics import EVENTS
from settings import Settings

# 3: recent commands keyed by tenant, agent and command id; 4: consent, removals, the records of
# each subject, and stats counted per subject; 5: the caller of each recent command, when each
# subject's grant was given and its memory erased, and index keys with length-prefixed parts;
# 6: personal entries sealed, record keys hashed in the index, and the erasures; 7: a live fact's
# index entry names its kind and key, and the index is sealed per agent.
# Older snapshots are folded again.
FORMAT = 7


class _State(msgspec.Struct):
    records: dict[str, bytes]  # with no cipher; else `sealed_records`
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
    erasures: dict[str, datetime]
    sealed: bool  # records, staged writes and block texts (a cipher was in use)
    # The records' keys in the state's order, and per subject the positions of its records
    # there and the token of their JSON (a msgpack list).
    record_keys: list[str]
    sealed_records: list[tuple[str, list[int], str]]
    blocks: dict[str, dict[str, str]] = {}  # agent -> {label: text}
    # agent -> {run: (last write, [(entry id, chars)])}: ids, sizes and times only, never text.
    # A snapshot without it was taken before any run event existed, so empty is right.
    runs: dict[str, dict[str, tuple[datetime, list[tuple[str, int]]]]] = {}
    usage_marks: dict[str, int] = {}  # agent|usage partition -> last usage offset counted
    # Note owner -> {note id: (revision, when saved)}, with no cipher; else `sealed_notes`, each
    # owner's sealed under its subject's key (an owner is spelled as a subject), so an erased
    # member's notes go as their records do. Empty in a snapshot from before notes.
    notes: dict[str, dict[str, tuple[int, datetime]]] = {}
    sealed_notes: dict[str, str] = {}
    # subject -> the token of its index entries (a msgpack map), with a cipher; else `index`.
    sealed_index: dict[str, str] = {}
    # agent|u:user -> (version, text, when): member profiles, the text sealed under the member's key.
    # A snapshot without it was taken before any profile existed, so empty is right.
    profiles: dict[str, tuple[int, str, datetime]] = {}
    # Tenant and platform memory's ids and statuses (no text): empty in a snapshot from before it.
    shared: dict[str, dict[str, str]] = {}
    # The idempotency window (`workers.processors.ledger.processor.RecentCommands`): when each recent command was
    # decided (ms since the epoch), and the older commands of the window, whose events are no
    # longer held: (key, caller, when). Empty in a snapshot from before the window was a time.
    recent_at: dict[str, int] = {}
    older: list[tuple[str, str | None, int]] = []


class _Window(msgspec.Struct):
    """A snapshot's idempotency window alone (the rest of its fields are skipped)."""

    recent_at: dict[str, int] = {}
    older: list[tuple[str, str | None, int]] = []


class Snapshot(msgspec.Struct):
    format: int
    next_offset: int
    last_sha: str
    state: bytes  # a msgpack `_State`, encoded when the snapshot was taken


class _Whose(msgspec.Struct):
    """Whose key seals a record (never a personal field)."""

    user: str | None = None


class _Writer(msgspec.Struct):
    """Whose key seals a staged write: its member's, as the command's own sealing names it."""

    tenant: str
    agent: str
    user: str | None = None
    provenance: dict[str, Any] = {}


_WHOSE = msgspec.json.Decoder(_Whose)
_WRITER = msgspec.json.Decoder(_Writer, strict=False)
_RAWS = msgspec.msgpack.Decoder(list[bytes])
_UNOPENED = (KeyDestroyed, KeyMissing)


def sha(event: bytes) -> str:
    return hashlib.sha256(event).hexdigest()


def path_for(settings: Settings, partition: int) -> Path:
    return Path(settings.data_dir) / "ledger" / f"{settings.topic(EVENTS.name)}-{partition}.snapshot"


def _staged_aad(key: str, i: int) -> str:
    return f"staged:{key}#{i}"


def _block_aad(ak: str, label: str) -> str:
    return f"block:{ak}#{label}"


def _profile_aad(key: str) -> str:
    return f"profile:{key}"


def _notes_aad(owner: str) -> str:
    return f"notes:{owner}"


def _index_aad(subject: str) -> str:
    return f"index:{subject}"


def _seal_index(c: Cipher, index: Mapping[str, str], records: Mapping[str, bytes]) -> dict[str, str]:
    """Each entry under the key of the record it names (the one its records are sealed under
    already, so no new key is made): a member's erasure takes their entries with their records."""
    by_subject: dict[str, dict[str, str]] = {}
    for k, v in index.items():
        ak = k.split("|", 1)[0]
        raw = records.get(f"{ak}/{v.split(' ', 1)[0]}")
        user = _WHOSE.decode(raw).user if raw is not None else None
        by_subject.setdefault(f"{ak}|u:{user}" if user else ak, {})[k] = v
    return {subject: seal_text(c, subject, _index_aad(subject), msgspec.msgpack.encode(entries).hex())
            for subject, entries in by_subject.items()}


def _opened_sealed(c: Cipher | None, sealed: dict[str, str], aad: Callable[[str], str],
                   decoder: Any) -> tuple[dict[str, Any], int]:
    """Each entry of `sealed` (owner -> token of a msgpack value, hex) opened and decoded, and how
    many did not open: their keys were destroyed (erased), so they are dropped."""
    if not sealed:
        return {}, 0
    if c is None:
        raise ContractError("sealed", "a sealed ledger snapshot, and this process has no keys")
    out: dict[str, Any] = {}
    for owner, token in sealed.items():
        try:
            out[owner] = decoder.decode(bytes.fromhex(open_text(c, aad(owner), token)))
        except _UNOPENED:
            pass
        except ValueError as e:
            raise ContractError("sealed", f"a sealed entry does not open: {e}") from None
    return out, len(sealed) - len(out)


_NOTES = msgspec.msgpack.Decoder(dict[str, tuple[int, datetime]])
_INDEX = msgspec.msgpack.Decoder(dict[str, str])


def _records_aad(subject: str) -> bytes:
    return f"records:{subject}".encode()


def _seal_records(c: Cipher, records: Mapping[str, bytes]) -> tuple[list[str], list[tuple[str, list[int], str]]]:
    keys: list[str] = []
    groups: dict[str, tuple[list[int], list[bytes]]] = {}
    for i, (k, raw) in enumerate(records.items()):
        keys.append(k)
        whose = _WHOSE.decode(raw)
        ak = k.rsplit("/", 1)[0]
        subject = f"{ak}|u:{whose.user}" if whose.user else ak  # the member a record names owns it, any scope
        at, raws = groups.setdefault(subject, ([], []))
        at.append(i)
        raws.append(raw)
    return keys, [(subject, at, c.seal(subject, _records_aad(subject), msgspec.msgpack.encode(raws)))
                  for subject, (at, raws) in groups.items()]


def _seal_staged(c: Cipher, key: str, i: int, raw: str) -> str:
    w = _WRITER.decode(raw)
    return seal_text(c, subject_of(w.tenant, w.agent, w.user or w.provenance.get("user")), _staged_aad(key, i), raw)


def encode_state(state: LedgerState, recent: OrderedDict[str, list[bytes]],
                 callers: Mapping[str, str | None] | None = None, recent_at: Mapping[str, int] | None = None,
                 older: list[tuple[str, str | None, int]] | None = None, c: Cipher | None = None) -> bytes:
    """The state as it is now: called between batches, when it folds every event sent so far.
    `recent`, `callers`, `recent_at` and `older` are `RecentCommands`'. A subject with no key
    yet gets one (`Keyring.pending`): the caller publishes it before writing the snapshot. Sealed
    by `c`; plaintext without one."""
    callers = callers or {}
    records: dict[str, bytes] = {}
    record_keys: list[str] = []
    sealed_records: list[tuple[str, list[int], str]] = []
    if c is None:
        records = dict(state.records)
        staged = {k: list(v) for k, v in state.staged.items()}
        blocks = {k: dict(v) for k, v in state.blocks.items()}
        profiles = {k: cast("tuple[int, str, datetime]", tuple(v)) for k, v in state.profiles.items()}
    else:
        record_keys, sealed_records = _seal_records(c, state.records)
        staged = {k: [_seal_staged(c, k, i, raw) for i, raw in enumerate(v)] for k, v in state.staged.items()}
        blocks = {ak: {label: seal_text(c, ak, _block_aad(ak, label), text) for label, text in v.items()}
                  for ak, v in state.blocks.items()}
        # The key is the member's subject key (`subject_rules.subject_key`): their key seals it.
        profiles = {k: (v, seal_text(c, k, _profile_aad(k), text) if text else "", at)
                    for k, (v, text, at) in state.profiles.items()}
    return msgspec.msgpack.encode(
        _State(
            records=records,
            index=dict(state.index) if c is None else {},
            sealed_index={} if c is None else _seal_index(c, state.index, state.records),
            staged=staged,
            open_turns={k: dict(v) for k, v in state.open_turns.items()},
            turns=dict(state.turns),
            turns_before=dict(state.turns_before),
            turns_since=state.turns_since,
            configs={k: cfg.model_dump_json().encode() for k, cfg in state.configs.items()},
            stats={k: dict(v) for k, v in state.stats.items()},
            recent=[(k, callers.get(k), v) for k, v in recent.items()],
            recent_at=dict(recent_at or {}),
            older=list(older or []),
            blocks=blocks,
            consent=dict(state.consent),
            granted_at=dict(state.granted_at),
            erased_at=dict(state.erased_at),
            removed_agents=dict(state.removed_agents),
            removed_users=dict(state.removed_users),
            subject_records={k: tuple(v) for k, v in state.subject_records.items()},
            erasures=dict(state.erasures),
            runs={ak: {run: (last, [cast("tuple[str, int]", tuple(p)) for p in pending])
                       for run, (last, pending) in v.items()}
                  for ak, v in state.runs.items()},
            usage_marks=dict(state.usage_marks),
            notes={} if c is not None else {k: dict(v) for k, v in state.notes.items()},
            sealed_notes={} if c is None else {
                owner: seal_text(c, owner, _notes_aad(owner), msgspec.msgpack.encode(dict(v)).hex())
                for owner, v in state.notes.items()},
            profiles=profiles,
            shared={k: dict(v) for k, v in state.shared.items()},
            sealed=c is not None,
            record_keys=record_keys,
            sealed_records=sealed_records,
        )
    )


def decode_window(data: bytes) -> tuple[dict[str, int], list[tuple[str, str | None, int]]]:
    """A snapshot's idempotency window: when its recent commands were decided, and the older ones."""
    w = msgspec.msgpack.decode(data, type=_Window)
    return w.recent_at, [(k, who, at) for k, who, at in w.older]


def decode_state(data: bytes, c: Cipher | None = None) -> tuple[LedgerState, list[tuple[str, str | None, list[bytes]]], int]:
    """The state, the recent commands, and how many sealed entries did not open: their keys
    were destroyed (the caller catches up on the keys first, so a key still unknown was too).
    Raises `events.codec.ContractError` for a sealed snapshot read without a cipher."""
    s = msgspec.msgpack.decode(data, type=_State)
    state = LedgerState(
        records=s.records,
        index=s.index,
        staged=s.staged,
        # The snapshot's plain dicts stand for the state's mappings (MutableMapping is invariant).
        open_turns=cast("MutableMapping[str, Mapping[str, datetime]]", s.open_turns),
        turns=s.turns,
        turns_before=s.turns_before,
        turns_since=s.turns_since,
        configs={k: AgentConfig.model_validate_json(v) for k, v in s.configs.items()},
        stats=s.stats,
        blocks=cast("MutableMapping[str, Mapping[str, str]]", s.blocks),
        consent=s.consent,
        granted_at=s.granted_at,
        erased_at=s.erased_at,
        removed_agents=s.removed_agents,
        removed_users=s.removed_users,
        subject_records=s.subject_records,
        erasures=s.erasures,
        runs={ak: {run: (last, tuple(cast("tuple[str, int]", tuple(p)) for p in pending))
                   for run, (last, pending) in v.items()}
              for ak, v in s.runs.items()},
        usage_marks=s.usage_marks,
        notes={k: {n: cast("tuple[int, datetime]", tuple(v)) for n, v in held.items()} for k, held in s.notes.items()},
        profiles={k: cast("tuple[int, str, datetime]", tuple(v)) for k, v in s.profiles.items()},
        shared=cast("MutableMapping[str, Mapping[str, str]]", s.shared),
    )
    # The index first: records that do not open take their index entries with them.
    index, unopened = _opened_sealed(c, s.sealed_index, _index_aad, _INDEX)
    for entries in index.values():
        state.index.update(entries)
    unopened += _opened(c, state, s.record_keys, s.sealed_records) if s.sealed else 0
    notes, not_opened = _opened_sealed(c, s.sealed_notes, _notes_aad, _NOTES)
    state.notes.update({owner: dict(v) for owner, v in notes.items()})
    return state, s.recent, unopened + not_opened


def _opened(c: Cipher | None, state: LedgerState, keys: list[str], sealed: list[tuple[str, list[int], str]]) -> int:
    """Opens the sealed entries into `state`; drops those that do not open, and returns how many."""
    if c is None:
        raise ContractError("sealed", "a sealed ledger snapshot, and this process has no keys")
    try:
        return _opening(c, state, keys, sealed)
    except ValueError as e:  # a token that does not match its key or place: not this snapshot's
        raise ContractError("sealed", f"a sealed entry does not open: {e}") from None


def _opening(c: Cipher, state: LedgerState, keys: list[str], sealed: list[tuple[str, list[int], str]]) -> int:
    raws: list[bytes | None] = [None] * len(keys)
    dropped: dict[str, set[str]] = {}
    gone: set[str] = set()
    n = 0
    for subject, at, token in sealed:
        try:
            for i, raw in zip(at, _RAWS.decode(c.open(token, _records_aad(subject)))):
                raws[i] = raw
        except _UNOPENED:
            gone.add(subject)
            n += len(at)
            for i in at:
                ak, rid = keys[i].rsplit("/", 1)
                dropped.setdefault(ak, set()).add(rid)
    state.records = {k: raw for k, raw in zip(keys, raws) if raw is not None}
    # What pointed at them, and their counts: a member's records of other scopes are counted
    # under their agent, so the agent's counts are recounted too.
    drop_records(state, dropped, also=gone | {agent_subject(s) for s in gone})
    for key, tokens in list(state.staged.items()):
        writes = []
        for i, token in enumerate(tokens):
            try:
                writes.append(open_text(c, _staged_aad(key, i), token))
            except _UNOPENED:
                n += 1
        if len(writes) == len(tokens):
            state.staged[key] = writes
        else:
            restage(state, key, writes)  # the turn is open from its first write left
    for ak, texts in list(state.blocks.items()):
        kept = {}
        for label, token in texts.items():
            try:
                kept[label] = open_text(c, _block_aad(ak, label), token)
            except _UNOPENED:
                n += 1
        if kept:
            state.blocks[ak] = kept
        else:
            del state.blocks[ak]
    for key, (version, token, written) in list(state.profiles.items()):
        try:
            state.profiles[key] = (version, open_text(c, _profile_aad(key), token) if token else "", written)
        except _UNOPENED:
            n += 1
            del state.profiles[key]
    return n


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
