"""Export the gateway's spans over OTLP (HTTP/protobuf) when the standard OpenTelemetry
environment asks for it: ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
(plus the exporter's other ``OTEL_*`` settings: headers, timeout, batch delay)."""

from __future__ import annotations

import os

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def otlp_tracer_provider(service_name: str = "turnlog-gateway") -> TracerProvider | None:
    """A TracerProvider exporting in batches over OTLP, or None when no endpoint is configured."""
    if not any(os.environ.get(name) for name in ENDPOINT_VARIABLES):
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider
