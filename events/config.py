"""An agent's memory configuration: `harness.memory` (records) and `harness.history` (session history)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DEFAULT_KINDS = ("guidance", "fact", "event", "reference")
WRITE_TOOLS = ("add_memory", "delete_memory", "read_memory", "pin_memory", "unpin_memory", "curate_block", "report_outcome",
               "profile_write")


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LabelSpec(_Strict):
    number: Annotated[int, Field(ge=5, le=18)]
    description: str = ""


ScopeName = Literal["session", "user", "agent"]


class ScopeConfig(_Strict):
    read: list[ScopeName] = ["session"]
    write: list[ScopeName] = ["session"]


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


# Memory is read and written in these session channels, and never in the ones
# below (triggers, scheduled runs, public chats, an agent inside a flow), whatever is configured.
DEFAULT_CHANNELS = ("studio", "dashboardChat", "api")
NEVER_CHANNELS = ("slack", "teams", "discord", "email", "scheduled", "explore", "visitor", "flow")
MEMBER_FACT_CHARS = 4000  # a member fact's body, in the member-facts preset


class RecallConfig(_Strict):
    # "sections": memlane's recall block; "facts": the member-facts block, two header lines and `- {key}: {content}`.
    format: Literal["sections", "facts"] = "sections"
    # A version already recalled in a conversation is never recorded as retrieved again;
    # "omit" also leaves it out of later recalls, "render" shows it again.
    recalled: Literal["omit", "render"] = "omit"


class ProfileConfig(_Strict):
    # Consolidation appends the preference facts it finds about a member (facts of kind
    # "preference" or "profile") to that member's profile (docs/features/profiles.md).
    enrich: bool = False


class MemoryConfig(_Strict):
    enabled: bool = True
    # "required": a subject (tenant + user + agent) gets no extraction, recall, injection or
    # tool write until its member grants consent.
    consent: Literal["required", "not_required"] = "not_required"
    channels: list[Annotated[str, Field(min_length=1, max_length=64)]] = list(DEFAULT_CHANNELS)
    # The longest fact text (summary and content together) in characters; None: only the
    # record's byte limits.
    fact_chars: Annotated[int, Field(ge=1, le=16_000)] | None = None
    # How many days a write lives at most, unless it sets an earlier expiry; None: until it is
    # deleted. A member's facts (user scope) expire after 180 days by default; the agent's own
    # memory (session and agent scope, episodes and procedures) is durable.
    member_fact_days: Annotated[int, Field(ge=1, le=3_650)] | None = 180
    workspace_days: Annotated[int, Field(ge=1, le=36_500)] | None = None
    recall: RecallConfig = RecallConfig()
    scope: ScopeConfig = ScopeConfig()
    kinds: list[Annotated[str, Field(min_length=1, max_length=64)]] = list(DEFAULT_KINDS)
    # True: every write names its kind, and one not in `kinds` is refused with 400 rather than
    # 422. False: a write without one takes the agent's default kind.
    kinds_required: bool = False
    labels: dict[str, LabelSpec] = {}
    tools: list[str] = ["add_memory", "read_memory", "delete_memory"]
    pinned: PinnedConfig | None = None
    search: SearchConfig = SearchConfig()
    extraction: ExtractionConfig = ExtractionConfig()
    profiles: ProfileConfig = ProfileConfig()
    # Whether a member may export their own memory with their key (`GET /v1/export`); operators
    # and agents always may export what they may read.
    member_export: bool = True

    @field_validator("labels")
    @classmethod
    def _unique_numbers(cls, v: dict[str, LabelSpec]) -> dict[str, LabelSpec]:
        seen: dict[int, str] = {}
        for name, spec in v.items():
            if spec.number in seen:
                raise ValueError(f"labels.{name}: number {spec.number} is already used by {seen[spec.number]!r}")
            seen[spec.number] = name
        return v

    @field_validator("channels")
    @classmethod
    def _allowed_channels(cls, v: list[str]) -> list[str]:
        never = [c for c in v if c.lower() in NEVER_CHANNELS]
        if never:
            raise ValueError(f"channel {never[0]!r} never reads or writes memory; never allowed: {', '.join(NEVER_CHANNELS)}")
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
    # Whether a history search may reach every session (conversation) of the agent, `scope:
    # "agent"`, and `message_history` another session than the caller's. Off: one session.
    across_conversations: bool = False


class AgentConfig(_Strict):
    memory: MemoryConfig = MemoryConfig()
    history: HistoryConfig | None = None
    has_sessions: bool = True

    @model_validator(mode="after")
    def _sessionless_needs_agent_scope(self) -> AgentConfig:
        if not self.has_sessions:
            s = self.memory.scope
            if "session" in s.read or "session" in s.write:
                raise ValueError("an agent without sessions must not read or write session scope: "
                                 "set memory.scope.read and write to ['agent'] or ['user']")
        return self


def member_facts(**memory: object) -> AgentConfig:
    """The member-facts preset: one member's facts per agent, given with consent, in the
    default channels, 4,000-character facts rendered as `- {key}: {content}` on every turn."""
    return AgentConfig(memory=MemoryConfig(**{
        "scope": ScopeConfig(read=["user"], write=["user"]),
        "consent": "required",
        "fact_chars": MEMBER_FACT_CHARS,
        "kinds": ["profile", "semantic", "episodic"],
        "recall": RecallConfig(format="facts", recalled="render"),
        "member_export": False,  # members read their facts in the app; there is no export
        **memory,
    }))


def channel_allowed(cfg: AgentConfig, channel: str | None) -> bool:
    """Whether a session in `channel` reads and writes memory; a turn without one is a platform without channels."""
    # Case does not let a never-channel in ("Slack" is slack).
    return channel is None or (channel.lower() not in NEVER_CHANNELS and channel in cfg.memory.channels)


def label_numbers_kept(old: AgentConfig, new: AgentConfig) -> str | None:
    """Labels keep their number once declared. Returns the offending label, if any."""
    for name, spec in old.memory.labels.items():
        if name in new.memory.labels and new.memory.labels[name].number != spec.number:
            return name
        if name not in new.memory.labels:
            return name
    return None
