"""Every error code memlane puts on the wire (HTTP error bodies, MCP tool errors, CommandRejected events).

The values are the wire strings; members compare equal to them and format as them, so a code read back from
Kafka or JSON (a plain str) equals its member.
"""

from __future__ import annotations

from enum import Enum


class ErrorCode(str, Enum):
    # Behave like the plain string everywhere (f-strings, str(), logs), not like "ErrorCode.X".
    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return self.value.__format__(spec)

    VALIDATION_FAILED = "VALIDATION_FAILED"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    FORBIDDEN = "FORBIDDEN"
    SCOPE_NOT_ALLOWED = "SCOPE_NOT_ALLOWED"
    TOOL_NOT_ALLOWED = "TOOL_NOT_ALLOWED"
    PIN_NOT_ENABLED = "PIN_NOT_ENABLED"
    MEMORY_DISABLED = "MEMORY_DISABLED"
    HISTORY_DISABLED = "HISTORY_DISABLED"
    READ_ONLY_KEY = "READ_ONLY_KEY"
    PREVIEW_READ_ONLY = "PREVIEW_READ_ONLY"
    WRITE_REFUSED = "WRITE_REFUSED"
    NOT_FOUND = "NOT_FOUND"
    NOT_LIVE = "NOT_LIVE"
    DUPLICATE_ID = "DUPLICATE_ID"
    LIMIT_EXCEEDED = "LIMIT_EXCEEDED"
    PIN_BUDGET_EXCEEDED = "PIN_BUDGET_EXCEEDED"
    COMMAND_FAILED = "COMMAND_FAILED"
    TIMEOUT = "TIMEOUT"
    UNAVAILABLE = "UNAVAILABLE"
    # The tenant has as much work waiting as it may (its queries to embed): retry after a while.
    RATE_LIMITED = "RATE_LIMITED"
    # The agent requires a member's consent (memory.consent) and this subject has none.
    CONSENT_REQUIRED = "CONSENT_REQUIRED"
    # The session's channel is not in memory.channels.
    CHANNEL_NOT_ALLOWED = "CHANNEL_NOT_ALLOWED"
    # The agent or the user was removed: its leftover memory is never served.
    SUBJECT_REMOVED = "SUBJECT_REMOVED"
    # A write named the version it read (`expected_version`) and the record has moved on.
    VERSION_CONFLICT = "VERSION_CONFLICT"
    # A note's save or forget named the revision it read (`expected_revision`) and the note is at another.
    REVISION_CONFLICT = "REVISION_CONFLICT"
    # Made by the Python client when a response is not a memlane error body.
    HTTP_ERROR = "HTTP_ERROR"
