"""Spans for Generate, continuing the caller's trace (W3C `traceparent` in the gRPC metadata).

`mmgate engine --otlp-traces-endpoint URL` (a vLLM engine argument) makes vLLM set up the
process's tracer provider and emit its own `llm_request` span per request; the spans here go
through the same provider: `mmgate.engine.generate` (the whole call, a child of the caller's
span) and `mmgate.engine.prepare` (tensors from the wire, the slot check, or vLLM's renderer),
and vLLM's span is made a child of ours by handing it our context as its trace headers.
Without the flag there is no provider and every span is a no-op.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.trace import SpanKind, Status, StatusCode

_tracer = trace.get_tracer("mmgate.engine")  # resolves to vLLM's provider once it is set


def incoming(metadata: Sequence[tuple[str, Any]] | None) -> Any:
    """The caller's trace context from a call's invocation metadata (None if it sent none)."""
    carrier = {k: v for k, v in metadata or () if isinstance(v, str)}
    return extract(carrier) if "traceparent" in carrier else None


def start_call(name: str, parent: Any, **attributes: Any) -> Any:
    return _tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)


def start_child(name: str, of: Any) -> Any:
    return _tracer.start_span(name, context=trace.set_span_in_context(of))


def headers(of: Any) -> Mapping[str, str] | None:
    """`of`'s context as trace headers for vLLM (None when the span is not recorded)."""
    if not of.is_recording():
        return None
    carrier: dict[str, str] = {}
    inject(carrier, context=trace.set_span_in_context(of))
    return carrier


def finish(span: Any, error: BaseException | None = None) -> None:
    if error is not None:
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, str(error)))
    span.end()
