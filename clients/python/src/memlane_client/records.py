"""A memory record as the API answers it (`GET /v1/memory/{id}`): the fields a caller reads, typed;
any field a newer server adds is kept as it came."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict


class Provenance(BaseModel):
    model_config = ConfigDict(extra="allow")

    source: str | None = None
    session: str | None = None
    turn: int | None = None
    execution_id: str | None = None
    invocation: int | None = None
    agent_version: int | None = None


class Record(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    version: int
    created: datetime
    modified: datetime
    tenant: str
    agent: str
    scope: str
    session: str | None = None
    user: str | None = None
    kind: str
    summary: str
    content: str = ""
    metadata: dict[str, Any] = {}
    labels: dict[str, str] = {}
    key: str | None = None
    confidence: float | None = None
    importance: float = 0.5
    usage_count: int = 0
    utility: float = 0.5
    expires_at: datetime | None = None
    status: str = "ACTIVE"
    pinned: bool = False
    replaces: str | None = None
    replaced_by: str | None = None
    preview: bool = False
    provenance: Provenance = Provenance()
    tags: list[str] = []
    classification: str | None = None
    observed_at: datetime | None = None
    valid_from: datetime | None = None
    valid_to: datetime | None = None
    recorded_at: datetime | None = None
    superseded_at: datetime | None = None
    confirmations: int = 0  # how many later writes from other runs restated it
