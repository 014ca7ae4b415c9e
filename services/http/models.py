"""What request bodies share: unknown fields are refused."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")



# Memory as it stood at a past point (docs/features/time-travel.md), in a request's body.
PastPoint = Annotated[str, Field(max_length=40, description="memory as it stood then: a time with its UTC offset "
                                 "(2026-03-01T12:00:00Z), or a log position of the agent's event partition")] | None
