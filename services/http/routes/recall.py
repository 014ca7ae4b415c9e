"""Recall: what an agent should remember before its next model call (benchmarked: a FastJSONResponse)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter
from pydantic import Field

from services.http.deps import Ctx, Svc
from services.http.models import Body
from services.http.responses import FastJSONResponse, record_out
from services.memory.reads import EMBED_MS

router = APIRouter()


class RecallRequest(Body):
    conversation: Annotated[str, Field(min_length=1, max_length=128)]
    text: Annotated[str, Field(max_length=16_000)]


@router.post("/v1/recall")
async def recall(body: RecallRequest, ctx: Ctx, s: Svc):
    res = await s.reads.recall(ctx, body.conversation, body.text)
    body_out = {
        "pinned": [{"id": r.id, "summary": r.summary, "version": r.version} for r in res.pinned],
        "records": [record_out(r, sc) for r, sc in res.records],
        "episodes": [record_out(r) for r in res.episodes],
        "procedures": [record_out(r) for r in res.procedures],
        "blocks": [{"scope": scope, "label": label, "text": text} for scope, label, text in res.blocks],
        "rendered": res.rendered,
    }
    return FastJSONResponse(body_out, headers={"Server-Timing": f"embed;dur={EMBED_MS.get():.2f}"})
