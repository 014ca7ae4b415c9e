"""Portable memory: the export file's lines, and what an import makes of a file.

An export is JSON lines: a header naming the format, then one line per record (every version the
caller may read, oldest first, with provenance and validity), block, note and profile. An import
reads such a file, or a Mem0 export (its memories: `memory`, `user_id`, `agent_id`, `metadata`,
`created_at`), and makes one write per live record. Each write's command id is derived from
where it came from, so importing a file again writes nothing twice.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

FORMAT = "memlane.export"
VERSION = 1
# Fields of an exported record version that a write carries over; the rest (ids, versions,
# status, usage, times the ledger sets) are the importing deployment's to make.
CARRIED = ("summary", "content", "kind", "scope", "key", "labels", "tags", "metadata", "pinned",
           "classification", "confidence", "importance", "expires_at", "observed_at", "valid_from", "valid_to")
LIVE = ("ACTIVE", "PENDING", "CONFLICT")


@dataclass(frozen=True)
class Write:
    """One memory to write: its command id, the member it belongs to (None: the agent's), and
    the fields of `POST /v1/memory`."""

    line: int
    command_id: str
    user: str | None  # sent as X-User
    fields: dict[str, Any]
    session: str | None = None  # sent as X-Session


@dataclass(frozen=True)
class Refusal:
    line: int
    field: str
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.field}: {self.reason}"


@dataclass(frozen=True)
class BlockLine:
    """One line of an exported block, added to the block of that label (a line already there is
    not added twice)."""

    line: int
    label: str
    scope: str
    application: str | None
    text: str


@dataclass(frozen=True)
class ProfileWrite:
    line: int
    user: str
    text: str


@dataclass
class Parsed:
    kind: str  # "memlane" or "mem0"
    writes: list[Write] = field(default_factory=list)
    blocks: list[BlockLine] = field(default_factory=list)
    profiles: list[ProfileWrite] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    skipped: int = 0  # records not live, and notes (they cite the source deployment's history)


def header(tenant: str, agent: str, user: str | None, exported_at: str) -> dict[str, Any]:
    return {"type": "header", "format": FORMAT, "version": VERSION, "tenant": tenant, "agent": agent,
            "user": user, "exported_at": exported_at}


def trailer(records: int, others: int) -> dict[str, Any]:
    """An export's last line: a file without it was cut short."""
    return {"type": "end", "records": records, "others": others}


def command_id(source: str, *parts: str) -> str:
    """The same source item gets the same command id on every run, so the ledger applies it once."""
    return f"import-{source}-" + hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]


def parse(text: str, tenant: str, agent: str) -> Parsed:
    """What importing `text` into `tenant`/`agent` writes, and what it refuses, line by line."""
    stripped = text.lstrip()
    if stripped.startswith("[") or (stripped.startswith("{") and _is_json_document(stripped)):
        return _mem0(json.loads(stripped), tenant, agent)
    return _memlane(text.splitlines(), tenant, agent)


def _is_json_document(text: str) -> bool:
    """A Mem0 export is one JSON document; a memlane export is one JSON value per line."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return False
    return isinstance(doc, dict) and doc.get("type") != "header"


def _memlane(lines: Iterable[str], tenant: str, agent: str) -> Parsed:
    out = Parsed("memlane")
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            item = json.loads(raw)
        except json.JSONDecodeError as e:
            out.refused.append(Refusal(n, "$", f"not JSON ({e.msg}); each line of an export is one JSON value"))
            continue
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "header":
            if item.get("format") != FORMAT or item.get("version") != VERSION:
                out.refused.append(Refusal(n, "format", f"expected {FORMAT} version {VERSION}, got "
                                           f"{item.get('format')!r} version {item.get('version')!r}"))
            continue
        if kind == "end":
            continue
        if kind == "block" and isinstance(item.get("text"), str) and item.get("label"):
            out.blocks += [BlockLine(n, item["label"], item.get("scope") or "agent", item.get("application"), text)
                           for text in item["text"].splitlines() if text.strip()]
            continue
        if kind == "profile" and isinstance(item.get("text"), str) and item.get("user"):
            out.profiles.append(ProfileWrite(n, item["user"], item["text"]))
            continue
        if kind != "record":
            if kind == "note":
                out.skipped += 1  # a note cites messages of the source's history, which are not here
            else:
                out.refused.append(Refusal(n, "type", f"unknown line type {kind!r}"))
            continue
        versions = item.get("versions")
        if not isinstance(versions, list) or not versions or not isinstance(versions[-1], dict):
            out.refused.append(Refusal(n, "versions", "a record line holds its versions, oldest first"))
            continue
        last = versions[-1]
        if last.get("status") not in LIVE:
            out.skipped += 1
            continue
        fields = {k: last[k] for k in CARRIED if last.get(k) not in (None, "", [], {})}
        origin = f"{last.get('tenant')}/{last.get('agent')}/{last.get('id')}#{last.get('version')}"
        out.writes.append(Write(n, command_id("memlane", tenant, agent, origin), last.get("user"), fields,
                                last.get("session")))
    return out


def _mem0_items(doc: Any) -> Iterator[Any]:
    if isinstance(doc, list):
        yield from doc
    elif isinstance(doc, dict):
        for name in ("results", "memories"):
            if isinstance(doc.get(name), list):
                yield from doc[name]
                return


def _mem0(doc: Any, tenant: str, agent: str) -> Parsed:
    """Mem0's memories: `memory` is the text; `user_id` makes it the member's, else the agent's.
    A memory of another agent (`agent_id` set and not this one) is refused, not moved."""
    out = Parsed("mem0")
    items = list(_mem0_items(doc))
    if not items:
        out.refused.append(Refusal(1, "$", "no memories: expected a JSON list, or an object with a "
                                   "`results` or `memories` list, of Mem0 memories"))
    for n, item in enumerate(items, 1):
        if not isinstance(item, dict) or not isinstance(item.get("memory"), str) or not item["memory"].strip():
            out.refused.append(Refusal(n, "memory", "each Mem0 memory needs its text in `memory`"))
            continue
        if item.get("agent_id") not in (None, "", agent):
            out.refused.append(Refusal(n, "agent_id", f"a memory of agent {item['agent_id']!r}; import it into "
                                       "that agent"))
            continue
        user = item.get("user_id") or None
        fields: dict[str, Any] = {"summary": item["memory"], "scope": "USER" if user else "AGENT"}
        metadata = item.get("metadata")
        if isinstance(metadata, dict) and metadata:
            fields["metadata"] = metadata
        if item.get("created_at"):
            fields["observed_at"] = item["created_at"]
        source = str(item.get("id") or item["memory"])
        out.writes.append(Write(n, command_id("mem0", tenant, agent, user or "", source), user, fields))
    return out
