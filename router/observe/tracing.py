"""OpenTelemetry spans of a request: ``lb_route_time``, ``queue_wait_time``, ``inference_time``.

Off by default (``otel_exporter = "none"``: no span is even created). ``console`` prints spans,
``otlp`` sends them over OTLP/HTTP to ``otel_endpoint`` (needs the package
``opentelemetry-exporter-otlp-proto-http``, not a default dependency). The three
spans are children of one ``request`` span and cover, from the router's clock:
lb_route_time = arrival until the request is sent to a replica (validation, cache lookup,
admission, dispatch); queue_wait_time = sent until the replica's first byte (its queue and
prefill); inference_time = first byte until the end of the answer.
"""

from __future__ import annotations

import time

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from router.errors import RouterError


class TracingError(RouterError, RuntimeError):
    """The tracing settings cannot be honoured (e.g. the OTLP exporter is not installed)."""


def make_tracer(exporter: str, endpoint: str | None) -> tuple[trace.Tracer | None, TracerProvider | None]:
    """A tracer for ``exporter`` (none | console | otlp) and its provider (shut it down at the
    end to flush); (None, None) when tracing is off. Raises TracingError."""
    if exporter == "none":
        return None, None
    span_exporter: SpanExporter
    if exporter == "console":
        span_exporter = ConsoleSpanExporter()
    else:
        span_exporter = _otlp(endpoint)
    provider = TracerProvider(resource=Resource.create({"service.name": "promptedge-router"}))
    provider.add_span_processor(BatchSpanProcessor(span_exporter))
    return provider.get_tracer("promptedge.router"), provider


def check_exporter(exporter: str) -> None:
    """Raise TracingError now (at start-up) if ``exporter`` cannot be used."""
    if exporter == "otlp":
        _otlp_class()


def _otlp_class() -> type[SpanExporter]:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise TracingError(
            "otel_exporter=otlp needs the package opentelemetry-exporter-otlp-proto-http "
            "(pip install opentelemetry-exporter-otlp-proto-http)"
        ) from None
    return OTLPSpanExporter


def _otlp(endpoint: str | None) -> SpanExporter:
    exporter = _otlp_class()
    return exporter(endpoint=endpoint) if endpoint else exporter()  # type: ignore[call-arg]


def record_spans(
    tracer: trace.Tracer,
    attributes: dict[str, str | int],
    started: float,
    forwarded: float | None,
    first_byte: float | None,
    end: float,
) -> None:
    """Emit the request's spans after the fact; times are ``time.perf_counter()`` seconds."""
    offset_ns = time.time_ns() - int(time.perf_counter() * 1e9)

    def ns(t: float) -> int:
        return offset_ns + int(t * 1e9)

    root = tracer.start_span("request", start_time=ns(started), attributes=attributes)
    context = trace.set_span_in_context(root)
    sent = forwarded if forwarded is not None else end
    tracer.start_span("lb_route_time", context=context, start_time=ns(started)).end(end_time=ns(sent))
    if forwarded is not None:
        first = first_byte if first_byte is not None else end
        tracer.start_span("queue_wait_time", context=context, start_time=ns(forwarded)).end(end_time=ns(first))
        tracer.start_span("inference_time", context=context, start_time=ns(first)).end(end_time=ns(end))
    root.end(end_time=ns(end))
