"""Traces across the pipeline: a message's W3C `traceparent` Kafka header carries its trace from
the platform's publish (or an API request) through extraction, the ledger and the projections.

`NO_TRACING` is the default and costs one attribute check per message. `OtelTracing` (the
`tracing` extra) is built by the composition root only when an OTLP endpoint is configured.
A span carries offsets, names of steps and counts; never a message's text."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

TRACEPARENT = "traceparent"
Headers = Sequence[tuple[str, bytes]]
# The `traceparent` header of the message being processed: a processor that sends its outputs
# later, for a whole batch (`batch_done`), keeps it with the work it defers.
_PROCESSING: ContextVar[tuple[tuple[str, bytes], ...]] = ContextVar("processing", default=())


def processing() -> tuple[tuple[str, bytes], ...]:
    """The headers that carry on the trace of the message being processed (none untraced)."""
    return _PROCESSING.get()


class NoTracing:
    """Tracing off: spans are not made, headers pass unchanged."""

    enabled = False

    @contextmanager
    def consumed(self, name: str, headers: Iterable[tuple[str, bytes]] | None, **attributes: Any
                 ) -> Iterator[tuple[tuple[str, bytes], ...]]:
        yield ()

    @contextmanager
    def served(self, name: str, traceparent: str | None, **attributes: Any) -> Iterator[Any]:
        yield None

    def current(self) -> tuple[tuple[str, bytes], ...]:
        return ()

    def begun(self, name: str, headers: Iterable[tuple[str, bytes]] | None, **attributes: Any) -> Any:
        return None

    def shutdown(self) -> None: ...


NO_TRACING = NoTracing()


def parent_of(headers: Iterable[tuple[str, bytes]] | None) -> str | None:
    for k, v in headers or ():
        if k == TRACEPARENT:
            return v.decode(errors="replace")
    return None


def carried(outs_headers: Headers, header: tuple[tuple[str, bytes], ...]) -> tuple[tuple[str, bytes], ...]:
    """An output's headers with the span's `traceparent`, unless the output already names one."""
    if not header or any(k == TRACEPARENT for k, _ in outs_headers):
        return tuple(outs_headers)
    return (*outs_headers, *header)


class OtelTracing:
    """Spans exported over OTLP/HTTP in batches, off the event loop (the SDK's own thread)."""

    enabled = True

    def __init__(self, service: str, endpoint: str, sample_ratio: float = 1.0, export_delay_ms: int = 5000) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.kinds = SpanKind
        self.provider = TracerProvider(resource=Resource.create({"service.name": service}),
                                       sampler=ParentBased(TraceIdRatioBased(sample_ratio)))
        url = endpoint if endpoint.rstrip("/").endswith("/v1/traces") else f"{endpoint.rstrip('/')}/v1/traces"
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url),
                                                            schedule_delay_millis=export_delay_ms))
        self.tracer = self.provider.get_tracer("memlane")
        self.propagator = TraceContextTextMapPropagator()

    def _context(self, traceparent: str | None) -> Any:
        return self.propagator.extract({TRACEPARENT: traceparent} if traceparent else {})

    def _header(self, span: Any) -> tuple[tuple[str, bytes], ...]:
        from opentelemetry import trace

        carrier: dict[str, str] = {}
        self.propagator.inject(carrier, context=trace.set_span_in_context(span))
        return tuple((k, v.encode()) for k, v in carrier.items() if k == TRACEPARENT)

    @contextmanager
    def consumed(self, name: str, headers: Iterable[tuple[str, bytes]] | None, **attributes: Any
                 ) -> Iterator[tuple[tuple[str, bytes], ...]]:
        """A span for one consumed message, child of the trace its headers carry (a new trace
        without one); yields the `traceparent` header its outputs carry on."""
        with self.tracer.start_as_current_span(name, context=self._context(parent_of(headers)),
                                               kind=self.kinds.CONSUMER, attributes=attributes) as span:
            header = self._header(span)
            token = _PROCESSING.set(header)
            try:
                yield header
            finally:
                _PROCESSING.reset(token)

    @contextmanager
    def served(self, name: str, traceparent: str | None, **attributes: Any) -> Iterator[Any]:
        """A server span for one HTTP request, current while it is handled."""
        with self.tracer.start_as_current_span(name, context=self._context(traceparent),
                                               kind=self.kinds.SERVER, attributes=attributes) as span:
            yield span

    def current(self) -> tuple[tuple[str, bytes], ...]:
        """The `traceparent` header of the current span (an API request's), for what it sends."""
        from opentelemetry import trace

        span = trace.get_current_span()
        return self._header(span) if span.get_span_context().is_valid else ()

    def begun(self, name: str, headers: Iterable[tuple[str, bytes]] | None, **attributes: Any) -> Any:
        """A span started now and ended by the caller (`span.end()`): a projection's write, which
        lands after the message that asked for it was read."""
        return self.tracer.start_span(name, context=self._context(parent_of(headers)), kind=self.kinds.CONSUMER,
                                      attributes=attributes)

    def shutdown(self) -> None:
        """Exports what is still batched."""
        self.provider.shutdown()


Tracing = NoTracing | OtelTracing
