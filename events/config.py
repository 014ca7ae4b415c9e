"""An agent's memory configuration: `harness.memory` (records) and `harness.history` (session history)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DEFAULT_KINDS = ("guidance", "fact", "event", "reference")
WRITE_TOOLS = ("add_memory", "delete_memory", "read_memory", "pin_memory", "unpin_memory", "curate_block", "report_outcome")


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LabelSpec(_Strict):
    number: Annotated[int, Field(ge=5, le=18)]
    description: str = ""


class ScopeConfig(_Strict):
    read: list[Literal["session", "agent"]] = ["session"]
    write: list[Literal["session", "agent"]] = ["session"]


class PinnedConfig(_Strict):
    max_tokens: Annotated[int, Field(ge=1, le=100_000)] = 2000


class SearchConfig(_Strict):
    mode: Literal["hybrid", "lexical", "vector"] = "hybrid"
    max_results: Annotated[int, Field(ge=1, le=100)] = 5
    min_score: Annotated[float, Field(ge=-1, le=1)] = 0.0


class EveryMessages(_Strict):
    messages: Annotated[int, Field(ge=1, le=1000)]


class ExtractionConfig(_Strict):
    prompt: Annotated[str, Field(max_length=16_000)] | None = None
    every: Literal["turn"] | EveryMessages = "turn"


class MemoryConfig(_Strict):
    enabled: bool = True
    scope: ScopeConfig = ScopeConfig()
    kinds: list[Annotated[str, Field(min_length=1, max_length=64)]] = list(DEFAULT_KINDS)
    labels: dict[str, LabelSpec] = {}
    tools: list[str] = ["add_memory", "read_memory", "delete_memory"]
    pinned: PinnedConfig | None = None
    search: SearchConfig = SearchConfig()
    extraction: ExtractionConfig = ExtractionConfig()

    @field_validator("labels")
    @classmethod
    def _unique_numbers(cls, v: dict[str, LabelSpec]) -> dict[str, LabelSpec]:
        seen: dict[int, str] = {}
        for name, spec in v.items():
            if spec.number in seen:
                raise ValueError(f"labels.{name}: number {spec.number} is already used by {seen[spec.number]!r}")
            seen[spec.number] = name
        return v

    @field_validator("tools")
    @classmethod
    def _known_tools(cls, v: list[str]) -> list[str]:
        for t in v:
            if t not in WRITE_TOOLS:
                raise ValueError(f"unknown tool {t!r}; allowed: {', '.join(WRITE_TOOLS)}")
        return v


class HistoryConfig(_Strict):
    index: Literal["messages", "messages_and_tools"] = "messages"


class AgentConfig(_Strict):
    memory: MemoryConfig = MemoryConfig()
    history: HistoryConfig | None = None
    has_sessions: bool = True

    @model_validator(mode="after")
    def _sessionless_needs_agent_scope(self) -> AgentConfig:
        if not self.has_sessions:
            s = self.memory.scope
            if s.read != ["agent"] or s.write != ["agent"]:
                raise ValueError("an agent without sessions must set memory.scope.read and write to ['agent']")
        return self


def label_numbers_kept(old: AgentConfig, new: AgentConfig) -> str | None:
    """Labels keep their number once declared. Returns the offending label, if any."""
    for name, spec in old.memory.labels.items():
        if name in new.memory.labels and new.memory.labels[name].number != spec.number:
            return name
        if name not in new.memory.labels:
            return name
    return None
