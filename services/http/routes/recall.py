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

from services.http.deps import Ctx, Svc, refuse_roles
from services.http.models import Body
from services.http.responses import FastJSONResponse, record_out
from services.memory.reads import EMBED_MS

router = APIRouter()


class RecallRequest(Body):
    conversation: Annotated[str, Field(min_length=1, max_length=128)]
    text: Annotated[str, Field(max_length=16_000)]


@router.post("/v1/recall")
async def recall(body: RecallRequest, ctx: Ctx, s: Svc):
    refuse_roles(ctx, ("member",), "lists, reads, edits and deletes the member's own facts; recall is the agent's")
    res = await s.reads.recall(ctx, body.conversation, body.text)
    body_out = {
        "pinned": [{"id": r.id, "summary": r.summary, "version": r.version} for r in res.pinned],
        "records": [record_out(r, sc) for r, sc in res.records],
        "episodes": [record_out(r) for r in res.episodes],
        "procedures": [record_out(r) for r in res.procedures],
        "blocks": [{"scope": scope, "label": label, "text": text} for scope, label, text in res.blocks],
        "rendered": res.rendered,
    }
    if (skipped := skipped_out(getattr(res, "skipped", None))) is not None:
        body_out["skipped"] = skipped
    if getattr(res, "memory_unavailable", False):
        body_out["memory_unavailable"] = True
    return FastJSONResponse(body_out, headers={"Server-Timing": f"embed;dur={EMBED_MS.get():.2f}"})


def skipped_out(skipped: Any) -> dict[str, Any] | None:
    """Why a recall was skipped, as JSON: its code, the field it names, and the reason."""
    if skipped is None:
        return None
    if isinstance(skipped, dict):
        return skipped
    if isinstance(skipped, str):
        return {"code": skipped, "field": None, "reason": skipped}
    code = getattr(skipped, "code", None)
    return {"code": getattr(code, "value", code), "field": getattr(skipped, "field", None),
            "reason": getattr(skipped, "reason", None) or str(skipped)}
