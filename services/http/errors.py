"""Every error answer has one body: {"error": {"code", "field", "message"}}, with the code's status."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from events.codec import from_validation_error
from events.errors import ErrorCode
from projections.qdrant.index import IndexUnavailable
from projections.records import CursorError
from services.errors import ApiError

if TYPE_CHECKING:
    from starlette.types import ExceptionHandler


def error_body(code: ErrorCode | str, field: str | None, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "field": field, "message": message}}


def error_response(code: ErrorCode | str, field: str | None, message: str, status: int) -> JSONResponse:
    return JSONResponse(error_body(code, field, message), status_code=status)


def api_error_item(e: ApiError) -> dict[str, Any]:
    """An error as one item of a batch answers it: the body, and the status it would have alone."""
    return {**error_body(e.code, e.field, e.message), "status": e.status,
            **({"retry_after": e.retry_after} if e.retry_after is not None else {})}


async def _api_error(request: Request, e: ApiError) -> JSONResponse:
    out = error_response(e.code, e.field, e.message, e.status)
    if e.retry_after is not None:
        out.headers["Retry-After"] = str(e.retry_after)
    return out


async def _cursor(request: Request, e: CursorError) -> JSONResponse:
    return error_response(ErrorCode.VALIDATION_FAILED, "after", f"after: {e}", 422)


async def _index_unavailable(request: Request, e: IndexUnavailable) -> JSONResponse:
    # What failed is the server's, not the caller's: the same request may succeed later.
    return error_response(ErrorCode.UNAVAILABLE, None, "the memory index could not answer; retry shortly", 503)


async def _model_validation(request: Request, e: ValidationError) -> JSONResponse:
    # Contract models validate again inside the service (e.g. the 512-byte summary limit).
    err = from_validation_error(e)
    return error_response(ErrorCode.VALIDATION_FAILED, err.field, str(err), 422)


async def _validation(request: Request, e: RequestValidationError) -> JSONResponse:
    err = e.errors()[0]
    loc = [str(p) for p in err["loc"] if p not in ("body", "query", "path", "header")]
    field = ".".join(loc)
    return error_response(ErrorCode.VALIDATION_FAILED, field, f"{field}: {err['msg']}", 422)


def install(app: FastAPI) -> None:
    # Starlette types a handler as taking any Exception; each of these is called with its own class only.
    app.add_exception_handler(ApiError, cast("ExceptionHandler", _api_error))
    app.add_exception_handler(CursorError, cast("ExceptionHandler", _cursor))
    app.add_exception_handler(IndexUnavailable, cast("ExceptionHandler", _index_unavailable))
    app.add_exception_handler(ValidationError, cast("ExceptionHandler", _model_validation))
    app.add_exception_handler(RequestValidationError, cast("ExceptionHandler", _validation))
