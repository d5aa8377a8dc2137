"""A small OpenTelemetry collector for tests: an OTLP/gRPC TraceService that keeps every span
it is sent (the OpenTelemetry SDK's exporter is the real client)."""

from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    service: str  # the resource's service.name
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict


class Collector:
    def __init__(self) -> None:
        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as pb_grpc

        self.spans: list[Span] = []
        self._lock = threading.Lock()
        collector = self

        class TraceService(pb_grpc.TraceServiceServicer):
            def Export(self, request, context):  # noqa: N802 - the gRPC method's name
                collector._keep(request)
                return pb.ExportTraceServiceResponse()

        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_TraceServiceServicer_to_server(TraceService(), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _keep(self, request) -> None:
        found = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            service = str(resource.get("service.name", ""))
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    attributes = {a.key: _value(a.value) for a in s.attributes}
                    found.append(
                        Span(
                            service,
                            s.name,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            attributes,
                        )
                    )
        with self._lock:
            self.spans.extend(found)

    def wait_for(self, names: set[str], trace_id: str, timeout: float = 30.0) -> list[Span]:
        """The spans of `trace_id`, once every name in `names` has arrived."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                spans = [s for s in self.spans if s.trace_id == trace_id]
            if names <= {s.name for s in spans} or time.monotonic() > deadline:
                return spans
            time.sleep(0.1)

    def stop(self) -> None:
        self._server.stop(grace=None)


def _value(value) -> object:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None
