"""The caller's trace, carried on to memlane: its W3C `traceparent`, when the application traces
with OpenTelemetry (only its API is needed, and none of it when the application does not)."""

from __future__ import annotations

import sys


def traceparent() -> str | None:
    """The current span's `traceparent`, or None outside a span. Looked up only when the
    application has imported OpenTelemetry itself: an application that does not trace pays
    nothing, not even the import."""
    if "opentelemetry.trace" not in sys.modules:
        return None
    from opentelemetry.trace import format_span_id, format_trace_id, get_current_span

    ctx = get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{format_trace_id(ctx.trace_id)}-{format_span_id(ctx.span_id)}-{int(ctx.trace_flags):02x}"
