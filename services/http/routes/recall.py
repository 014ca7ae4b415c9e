"""Recall: what an agent should remember before its next model call (benchmarked: a FastJSONResponse).

A subject that may not have memory now (no consent, a channel without memory, a removed agent or
member) gets 200 with an empty block and `skipped` naming the code and why, and a recall whose
memory read failed gets 200 with an empty block and `memory_unavailable: true`: the platform's
turn continues either way. A member key never recalls (recall is the agent's).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import Field

from events.base import AppId, RunId
from events.rules.recall_render import LAYERS, SHARED
from events.rules.subjects import Refusal
from services.http.deps import Ctx, Svc
from services.http.models import Body, PastPoint
from services.http.responses import FastJSONResponse, record_out
from services.http.routes.blocks import block_out
from services.memory.reads import EMBED_MS
from services.memory.rules import NOT_MEMBER, check_role

router = APIRouter()


class RecallRequest(Body):
    conversation: Annotated[str, Field(min_length=1, max_length=128)]
    text: Annotated[str, Field(max_length=16_000)]
    run_id: RunId | None = None  # the run whose session memory (summary and entries) recall shows
    # The application the turn runs in: its application-scoped blocks join the agent's and workspace's.
    application: AppId | None = None
    # Names this attempt: the same request sent again (a retry on another replica) is shown
    # what the first attempt showed, though that attempt marked its records recalled.
    request_id: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")] | None = None
    # What recall would have shown at a past point, from memory as it stood then: nothing is
    # marked recalled and no use recorded.
    as_of: PastPoint = None


@router.post("/v1/recall")
async def recall(body: RecallRequest, ctx: Ctx, s: Svc):
    check_role(ctx, NOT_MEMBER, "recall memory")
    reads = await s.reads_at(ctx, body.as_of, ranked=True)
    res = await reads.recall(ctx, body.conversation, body.text, body.run_id, body.application, body.request_id)
    # The layers' names, in the order the block renders them (`LAYERS` in events.rules.recall_render).
    body_out: dict[str, Any] = {
        "blocks": [block_out(*b) for b in res.blocks],
        "pinned": [{"id": r.id, "summary": r.summary, "version": r.version} for r in res.pinned],
        "sessionSummary": res.session_summary,
        "sessionEntries": [e.as_json() for e in res.session_entries],
        "workspaceEntries": [record_out(r, sc) for r, sc in res.records],
        "relevantEpisodes": [record_out(r) for r in res.episodes],
        "procedures": [record_out(r) for r in res.procedures],
        "antiPatterns": [record_out(r) for r in res.avoid],
        **{layer.json: [e.as_json() for e in res.shared.get(layer.heading, ())] for layer in LAYERS
           if layer.heading in SHARED},
        "rendered": res.rendered,
    }
    if res.skipped is not None:
        body_out["skipped"] = skipped_out(res.skipped)
    if res.memory_unavailable:
        body_out["memory_unavailable"] = True
    return FastJSONResponse(body_out, headers={"Server-Timing": f"embed;dur={EMBED_MS.get():.2f}"})


def skipped_out(skipped: Refusal) -> dict[str, Any]:
    """Why a recall was skipped, as JSON: its code, the field it names, and the reason."""
    return {"code": skipped.code.value, "field": skipped.field, "reason": skipped.reason}
