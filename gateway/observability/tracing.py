"""OpenTelemetry traces: `mmgate serve --otlp-traces-endpoint URL`, vLLM's flag.

A client's W3C `traceparent` (or a new trace) continues through one span per request (HTTP
server span, `POST /v1/chat/completions`) and its stages: `mmgate.parse` (body, JSON,
limits), `mmgate.queue` (admission), `mmgate.render` (validation, chat template, tokens),
`mmgate.media.fetch`, `mmgate.preprocess`, `mmgate.worker.generate` (one per call to a
worker, retries included) and `mmgate.stream` (the SSE response). The worker call carries the
trace on in its gRPC metadata (`traceparent`, `tracestate`), where `mmgate engine` adds its
own spans and vLLM its `llm_request`.

Spans go to an OTLP collector, over gRPC unless `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` is
`http/protobuf` (as in vLLM), in batches. Off by default: every function here is then a
check of one global and nothing is imported.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

_tracer: Any = None  # an opentelemetry Tracer once configure() was given an endpoint
_NO_METADATA: tuple[tuple[str, str], ...] = ()


def configure(endpoint: str | None, service_name: str = "mmgate-gateway") -> bool:
    """Export spans to `endpoint` from now on (None: tracing stays off)."""
    global _tracer
    if not endpoint:
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(_exporter(endpoint)))
    _tracer = provider.get_tracer("mmgate.gateway")
    return True


def _exporter(endpoint: str) -> Any:
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=endpoint)
    if protocol != "grpc":
        raise ValueError(f"unsupported OTEL_EXPORTER_OTLP_TRACES_PROTOCOL {protocol!r}")
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=endpoint, insecure=not endpoint.startswith("https://"))


def enabled() -> bool:
    return _tracer is not None


@contextlib.contextmanager
def span(name: str, **attributes: Any) -> Iterator[Any]:
    """A child of the current span for the `with` block (the current one inside it); None
    when tracing is off. Exceptions are recorded on it."""
    if _tracer is None:
        yield None
        return
    with _tracer.start_as_current_span(name, attributes=_clean(attributes)) as current:
        yield current


def start(name: str, **attributes: Any) -> Any:
    """A child of the current span, not made current: for spans that cross `yield`s of an
    async generator. End it with `finish`."""
    if _tracer is None:
        return None
    return _tracer.start_span(name, attributes=_clean(attributes))


def finish(opened: Any, error: BaseException | None = None) -> None:
    if opened is None:
        return
    if error is not None:
        from opentelemetry.trace import Status, StatusCode

        opened.record_exception(error)
        opened.set_status(Status(StatusCode.ERROR, str(error)))
    opened.end()


def metadata(opened: Any) -> Sequence[tuple[str, str]]:
    """gRPC metadata carrying `opened`'s trace to the worker (none when tracing is off)."""
    if opened is None:
        return _NO_METADATA
    from opentelemetry.propagate import inject
    from opentelemetry.trace import set_span_in_context

    carrier: dict[str, str] = {}
    inject(carrier, context=set_span_in_context(opened))
    return tuple(carrier.items())


def _clean(attributes: dict[str, Any]) -> dict[str, Any]:
    return {k.replace("_", "."): v for k, v in attributes.items() if v is not None}


def server_span(method: str, route: str, headers: Mapping[str, str]) -> Any:
    """The HTTP server span of one request (a context manager), continuing the trace of the
    client's `traceparent` in `headers`, if any. Only called when tracing is on."""
    from opentelemetry.propagate import extract
    from opentelemetry.trace import SpanKind

    return _tracer.start_as_current_span(
        f"{method} {route}",
        context=extract(headers),
        kind=SpanKind.SERVER,
        attributes={"http.request.method": method, "http.route": route},
    )
