"""Notes (docs/features/notes.md): what an agent writes down itself, each note a topic and a summary citing
1 to 32 messages of its history it can see. Saving, reading, forgetting and searching them, and
recall's "Notes" layer.

A note belongs to one identity: the agent's key speaking for one member (X-User) or for none.
Only that identity reads it: never another agent, member or operator (an operator removes notes
only by erasing their member or removing the agent). Every read re-checks the sources against
history (`services.http.history_access.visible_messages`): a note one of whose sources was deleted
or is hidden from the caller now is never shown (a read by id says it is hidden, and shows only
its id, revision and sources' ids, so the agent can revise or forget it).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import structlog

from events.commands import ForgetNote, SaveNote
from events.config import AgentConfig
from events.errors import ErrorCode
from events.rules import notes as rules
from events.rules.history import (
    KeptEvent,
    across_conversations,
    decode_offset,
    encode_cursor,
    fingerprint,
    kinds_for,
    render,
    split_parts,
)
from events.rules.recall_render import Entry
from projections.redis.history_view import RedisHistory
from projections.redis.note_view import Note, NoteView
from services.errors import ApiError
from services.memory.context import Context
from services.memory.ports import RecallAsk
from services.memory.rules import check_enabled, check_role

if TYPE_CHECKING:
    from services.memory.commands import MemoryCommands

log = structlog.get_logger()

NOTE_ROLES = ("agent", "helper")  # the agent's own keys; never a member's or an operator's
HEADING = "Notes"
# `services.http.history_access.visible_messages`: which of some (session, message id) refs a
# caller can see in history now. The HTTP layer hands it in (it sits above this package).
Visible = Callable[..., Awaitable[dict[rules.Ref, KeptEvent]]]


class MemoryNotes:
    def __init__(self, commands: MemoryCommands, visible: Visible | None = None) -> None:
        self.commands = commands
        self.settings = commands.settings
        self.view = NoteView(commands.records)
        self._history: RedisHistory | None = None
        # Which of a note's sources history still shows (None: every source counts as shown).
        self.visible = visible

    @property
    def history(self) -> RedisHistory:
        """History's Redis side, over the record view's client: where sources are checked."""
        if self._history is None:
            rec = self.commands.records
            self._history = RedisHistory(rec.r, self.settings.topic_prefix, keys=rec.keys, codec=rec.codec)
        return self._history

    # ------------------------------------------------------------------ checks

    async def _check(self, ctx: Context, what: str, write: bool = False) -> AgentConfig:
        """Who may touch notes, and whether notes are on: the agent's own key (an operator never
        reads them), memory on, history on (notes cite it), and the subject rule (consent,
        channel, removal). A write also needs a key that writes, in a live turn."""
        if ctx.principal.role == "operator":
            raise ApiError(ErrorCode.FORBIDDEN, "authorization", f"an operator key never can {what}: notes are the "
                           "agent's own; erasing their member or removing the agent removes them", 403)
        check_role(ctx, NOTE_ROLES, what)
        cfg = await self.commands.config(ctx.tenant, ctx.agent)
        check_enabled(ctx, cfg, self.settings.memory_kill_switch)
        if write and not ctx.principal.can_write:
            raise ApiError(ErrorCode.READ_ONLY_KEY, "authorization", "this key can read notes but never write them")
        if write and ctx.preview:
            raise ApiError(ErrorCode.PREVIEW_READ_ONLY, "x-preview", "notes are live memory for every turn; a "
                           "preview turn reads them but cannot change them")
        if cfg.history is None:
            raise ApiError(ErrorCode.HISTORY_DISABLED, "harness.history", "notes cite messages of the agent's "
                           "history, and history is off for this agent; set harness.history.index", 403)
        await self.commands.check_subject(ctx, cfg)
        return cfg

    async def _visible(self, ctx: Context, cfg: AgentConfig, refs: Sequence[rules.Ref], text: bool = False
                       ) -> dict[rules.Ref, KeptEvent]:
        """Those of `refs` the caller can see in history now: one round trip for all of them.
        Their texts only with `text` (memory_read shows them; a check needs none)."""
        if not refs or cfg.history is None:
            return {}
        if self.visible is None:
            raise ApiError(ErrorCode.UNAVAILABLE, None, "this process cannot check notes' sources (no history "
                           "access was given to the memory service)", 503)
        return await self.visible(self.history, ctx, list(dict.fromkeys(refs)), kinds=kinds_for(cfg.history.index),
                                  text=text)

    def _shown(self, note: Note, visible: Mapping[rules.Ref, Any], cfg: AgentConfig) -> bool:
        return rules.shown(note.sources, note.session, visible, across_conversations(cfg))

    async def _shown_notes(self, ctx: Context, cfg: AgentConfig, notes: Sequence[Note], want: int) -> list[Note]:
        """The first `want` of `notes` (in their order) whose sources all check out now. The sources
        of `want` notes at a time are read together, so one round trip usually serves."""
        out: list[Note] = []
        at = 0
        while len(out) < want and at < len(notes):
            batch = notes[at:at + max(want - len(out), 1)]
            at += len(batch)
            visible = await self._visible(ctx, cfg, [ref for n in batch for ref in n.sources])
            out.extend(n for n in batch if self._shown(n, visible, cfg))
        return out[:want]

    # ------------------------------------------------------------------ writes

    async def save(self, ctx: Context, note_id: str, topic: str, summary: str,
                   source_messages: Sequence[str | Mapping[str, Any]], expected_revision: int,
                   wait: bool = True) -> dict[str, Any]:
        """memory_save: `expected_revision` 0 makes the note, else it must be the current revision
        (409 REVISION_CONFLICT otherwise, and nothing changes). Every source must be a message the
        caller can see now (422 naming `source_messages.<index>` otherwise)."""
        cfg = await self._check(ctx, "save a note", write=True)
        try:
            refs = rules.resolve_sources(source_messages, ctx.session, across_conversations(cfg))
        except rules.SourceError as e:
            raise ApiError(ErrorCode.VALIDATION_FAILED, e.field, str(e), 422) from None
        visible = await self._visible(ctx, cfg, list(refs))
        for ref, i in refs.items():
            if ref not in visible:
                raise ApiError(ErrorCode.VALIDATION_FAILED, f"source_messages.{i}",
                               f"source_messages.{i}: message {ref[1]} of conversation {ref[0]} is not one this caller "
                               "can see (it does not exist, was deleted, or is another member's or hidden from the "
                               "agent); cite messages found by a history search", 422)
        self.commands._screen(ctx, topic=topic, summary=summary)
        cmd = self.commands._command(
            SaveNote, ctx, note_id=note_id, topic=topic, summary=summary,
            sources=[{"conversation": c, "id": m} for c, m in refs], expected_revision=expected_revision,
            session=ctx.session)

        async def outcome(cmd: Any, events: list[Any]) -> dict[str, Any]:
            self.commands._rejected(events)
            saved = next(e for e in events if e.type == "NoteSaved")
            await self._until_revision(cmd, ctx, note_id, lambda r: r >= saved.revision,
                                       f"revision {saved.revision} of note {note_id}")
            note = Note(saved.note_id, saved.revision, saved.topic, saved.summary,
                        tuple((s.conversation, s.id) for s in saved.sources), saved.session, saved.occurred_at,
                        saved.user)
            return {"command_id": cmd.command_id, "status": "applied", "note": note.as_json()}

        return await self.commands.submit(cmd, wait, outcome)

    async def forget(self, ctx: Context, note_id: str, expected_revision: int | None = None,
                     wait: bool = True) -> dict[str, Any]:
        """memory_forget: the note goes; the messages it cited stay."""
        await self._check(ctx, "forget a note", write=True)
        cmd = self.commands._command(ForgetNote, ctx, note_id=note_id, expected_revision=expected_revision)

        async def outcome(cmd: Any, events: list[Any]) -> dict[str, Any]:
            self.commands._rejected(events)
            gone = next(e for e in events if e.type == "NoteForgotten")
            await self._until_revision(cmd, ctx, note_id, lambda r: r != gone.revision,
                                       f"note {note_id} forgotten")
            return {"command_id": cmd.command_id, "status": "applied", "id": note_id, "revision": gone.revision,
                    "forgotten": True}

        return await self.commands.submit(cmd, wait, outcome)

    async def _until_revision(self, cmd: Any, ctx: Context, note_id: str, ok: Any, what: str) -> None:
        """Read-your-writes: the note view (the redis-projection worker's) shows the change."""

        async def shown() -> bool:
            return ok(await self.view.revision(ctx.tenant, ctx.agent, ctx.user, note_id))

        await self.commands._until(cmd, shown, what)

    # ------------------------------------------------------------------ reads

    async def read(self, ctx: Context, note_id: str) -> dict[str, Any]:
        """memory_read: the note with its source messages, each re-checked now. A note with a
        source the caller cannot see any more is `hidden`: its text and its sources' are left out."""
        cfg = await self._check(ctx, "read a note")
        note = await self.view.get(ctx.tenant, ctx.agent, ctx.user, note_id)
        if note is None:
            raise ApiError(ErrorCode.NOT_FOUND, "note_id", f"note {note_id} does not exist for this identity", 404)
        visible = await self._visible(ctx, cfg, note.sources, text=True)
        if not self._shown(note, visible, cfg):
            return {"id": note.id, "revision": note.revision, "hidden": True,
                    "reason": "a source message was deleted or is no longer visible to this caller; revise the note "
                              "with sources it can see, or forget it",
                    "source_messages": [{"conversation": c, "id": m, "visible": rules.shown(
                        [(c, m)], note.session, visible, across_conversations(cfg))} for c, m in note.sources]}
        sources = []
        for c, m in note.sources:
            e = visible[(c, m)]
            sources.append({**render(e, e.text, None, len(split_parts(e.text))), "conversation": c, "visible": True})
        return {**note.as_json(), "hidden": False, "source_messages": sources}

    async def search(self, ctx: Context, query: str | None = None, limit: int = 10,
                     cursor: str | None = None) -> dict[str, Any]:
        """memory_search with kind "notes": the identity's notes that share words with `query`
        (most shared first; a topic's words count twice), or all newest first without one. Only
        notes whose sources all check out now."""
        cfg = await self._check(ctx, "search notes")
        notes = await self.view.all(ctx.tenant, ctx.agent, ctx.user)
        ordered = rules.rank(notes, query) if query and query.strip() else rules.newest(notes)
        fp = fingerprint("notes", ctx.tenant, ctx.agent, ctx.user, query or "")
        start = 0
        if cursor:
            try:
                start = decode_offset(cursor, fp)
            except ValueError as e:
                msg = str(e) if str(e).startswith("cursor:") else "cursor: not a cursor this search returned"
                raise ApiError(ErrorCode.VALIDATION_FAILED, "cursor", msg) from None
        # Hidden notes are skipped, not counted: a page reads on until it is full or the notes end.
        page: list[Note] = []
        at = start
        while len(page) < limit and at < len(ordered):  # `at` grows each pass: it starts at 0 or more
            batch = ordered[at:at + limit - len(page)]
            at += len(batch)
            visible = await self._visible(ctx, cfg, [ref for n in batch for ref in n.sources])
            page.extend(n for n in batch if self._shown(n, visible, cfg))
        nxt = encode_cursor(at, fp) if at < len(ordered) else None
        return {"notes": [_listed(n) for n in page], "next_cursor": nxt}

    async def layer(self, ask: RecallAsk) -> dict[str, list[Entry]]:
        """Recall's "Notes" layer: the caller's notes most relevant to the turn's text, at most
        `rules.RECALLED`, each only if every source checks out now. Nothing for a key that is not
        the agent's, with history off, or when the identity has no notes."""
        ctx, cfg = ask.ctx, ask.cfg
        if ctx.principal.role not in NOTE_ROLES or cfg.history is None or self.visible is None:
            return {}  # (no history access: nothing can be checked, so nothing is shown)
        t0 = time.perf_counter()
        ranked = rules.rank(await self.view.all(ctx.tenant, ctx.agent, ctx.user), ask.text)
        if not ranked:
            return {}
        shown = await self._shown_notes(ctx, cfg, ranked, rules.RECALLED)
        log.debug("notes_recalled", notes=len(shown), of=len(ranked), ms=round((time.perf_counter() - t0) * 1000, 2))
        return {HEADING: [Entry(id=n.id, title=n.topic, text=n.summary,
                                extra=(("revision", n.revision), ("sources", len(n.sources)))) for n in shown]}


def _listed(n: Note) -> dict[str, Any]:
    return {"id": n.id, "revision": n.revision, "topic": n.topic, "summary": n.summary,
            "sources": len(n.sources), "conversation": n.session, "saved_at": n.saved_at.isoformat()}
