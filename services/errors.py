"""The error a service call answers with: its code, the field it names, what to do next, and its HTTP status."""

from __future__ import annotations

from events.errors import ErrorCode

STATUS_BY_CODE: dict[ErrorCode | str, int] = {
    ErrorCode.VALIDATION_FAILED: 422,
    ErrorCode.SCOPE_NOT_ALLOWED: 403,
    ErrorCode.TOOL_NOT_ALLOWED: 403,
    ErrorCode.PIN_NOT_ENABLED: 403,
    ErrorCode.MEMORY_DISABLED: 403,
    ErrorCode.READ_ONLY_KEY: 403,
    ErrorCode.PREVIEW_READ_ONLY: 403,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.CONSENT_REQUIRED: 403,
    ErrorCode.CHANNEL_NOT_ALLOWED: 403,
    ErrorCode.SUBJECT_REMOVED: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.NOT_LIVE: 409,
    ErrorCode.DUPLICATE_ID: 409,
    ErrorCode.LIMIT_EXCEEDED: 409,
    ErrorCode.PIN_BUDGET_EXCEEDED: 409,
    ErrorCode.VERSION_CONFLICT: 409,
    ErrorCode.REVISION_CONFLICT: 409,
    ErrorCode.TIMEOUT: 504,
    ErrorCode.RATE_LIMITED: 429,
}


class ApiError(Exception):
    def __init__(self, code: ErrorCode | str, field: str | None, message: str, status: int | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # seconds, for a Retry-After header
        # A code read back from a CommandRejected event is a plain string; known ones become members.
        self.code = ErrorCode(code) if code in ErrorCode._value2member_map_ else code
        self.field, self.message = field, message
        self.status = status or STATUS_BY_CODE.get(self.code, 400)
