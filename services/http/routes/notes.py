"""Notes (docs/features/notes.md): an agent's own notes, each a topic and a summary citing 1 to 32 messages
it can see. memory_save is PUT, memory_read GET, memory_forget DELETE, and memory_search with kind
"notes" is GET /v1/notes. Only the agent's key (speaking for a member with X-User, or for none)
reaches its notes; a member's or an operator's key never does.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from pydantic import Field

from events.base import RUN_ID_PATTERN, Ident
from events.commands import NOTE_SOURCES, NoteSummary, NoteTopic
from services.http.deps import Ctx, Svc
from services.http.models import Body

router = APIRouter(tags=["notes"])

NoteIdPath = Annotated[str, Path(min_length=1, max_length=128, pattern=RUN_ID_PATTERN,
                                 description="the note's id, the caller's choice: 1-128 letters, digits, '.', '_' or '-'")]


class SourceRef(Body):
    """A message of another session of the agent (where history across conversations is on)."""

    conversation: Ident
    id: Ident


class SaveNoteRequest(Body):
    topic: NoteTopic = Field(description="what the note is about: 1-200 characters")
    summary: NoteSummary = Field(description="the note: 1-2,000 characters")
    source_messages: Annotated[list[Ident | SourceRef], Field(min_length=1, max_length=NOTE_SOURCES)] = Field(
        description="1-32 messages the note is based on: a message id of this session (X-Session), or "
                    '{"conversation", "id"} for another session of the agent')
    expected_revision: Annotated[int, Field(ge=0)] = Field(
        description="0 to make the note; otherwise its current revision (409 REVISION_CONFLICT if it moved on)")


@router.put("/v1/notes/{note_id}")
async def save_note(note_id: NoteIdPath, body: SaveNoteRequest, ctx: Ctx, s: Svc, wait: bool = True):
    """memory_save: makes the note (`expected_revision` 0) or revises it (its current revision).
    Every source must be a message the caller can see now: 422 naming `source_messages.<index>`."""
    sources = [src if isinstance(src, str) else src.model_dump() for src in body.source_messages]
    return await s.notes.save(ctx, note_id, body.topic, body.summary, sources, body.expected_revision, wait=wait)


@router.get("/v1/notes/{note_id}")
async def read_note(note_id: NoteIdPath, ctx: Ctx, s: Svc):
    """memory_read: the note with its source messages, checked again now. A note a source of which
    was deleted or is no longer visible is `hidden`: only its id, revision and sources' ids."""
    return await s.notes.read(ctx, note_id)


@router.delete("/v1/notes/{note_id}")
async def forget_note(note_id: NoteIdPath, ctx: Ctx, s: Svc, wait: bool = True,
                      expected_revision: Annotated[int | None, Query(ge=1)] = None):
    """memory_forget: the note goes; the messages it cited stay."""
    return await s.notes.forget(ctx, note_id, expected_revision, wait=wait)


@router.get("/v1/notes")
async def search_notes(ctx: Ctx, s: Svc, query: Annotated[str | None, Query(max_length=4000)] = None,
                       limit: Annotated[int, Query(ge=1, le=100)] = 10,
                       cursor: Annotated[str | None, Query(max_length=512)] = None):
    """memory_search with kind "notes": the caller's notes sharing words with `query` (by topic and
    summary, most shared first), or all of them newest first; only notes whose sources all check
    out now. Paged: pass `next_cursor` back as `cursor`."""
    return await s.notes.search(ctx, query, limit, cursor)
