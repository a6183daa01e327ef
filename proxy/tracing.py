"""OpenTelemetry tracing for the proxy: one TracerProvider per proxy, never the global one.

The proxy creates the spans ("jsonrpc.request", "upstream.attempt", "mirror.copy"); this
module only decides where they go:

    none     no provider; a no-op tracer (the default: tracing costs nothing)
    console  one JSON object per finished span on stdout (debugging, tests)
    otlp     OTLP to a collector, if `opentelemetry-exporter-otlp` is installed
             (endpoint from the setting or the standard OTEL_EXPORTER_OTLP_* env vars)
"""

from __future__ import annotations

import importlib
import sys
from typing import IO, Any

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from chainstate.config import ConfigError

EXPORTERS = ("none", "console", "otlp")
DEFAULT_SERVICE_NAME = "chainstate-proxy"
DEFAULT_SAMPLE_RATIO = 1.0  # fraction of client requests traced (children follow the parent)
TRACER_NAME = "chainstate.proxy"

_OTLP_MODULES = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
)


def _otlp_module() -> Any:
    for name in _OTLP_MODULES:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ConfigError(
        "tracing exporter 'otlp' needs the OTLP exporter package: "
        "pip install opentelemetry-exporter-otlp-proto-http (or opentelemetry-exporter-otlp)"
    )


def _otlp_exporter(endpoint: str | None) -> SpanExporter:
    kwargs: dict[str, Any] = {"endpoint": endpoint} if endpoint else {}
    return _otlp_module().OTLPSpanExporter(**kwargs)


def check_exporter(exporter: str) -> None:
    """Raise ConfigError now if `exporter` cannot work here (unknown name, OTLP package
    missing), without building anything: for a supervisor before it forks its workers."""
    if exporter not in EXPORTERS:
        raise ConfigError(
            f"tracing exporter must be one of {', '.join(EXPORTERS)}, got {exporter!r}"
        )
    if exporter == "otlp":
        _otlp_module()


def check_settings(
    exporter: str = "none",
    service_name: str = DEFAULT_SERVICE_NAME,
    *,
    otlp_endpoint: str | None = None,
    sample_ratio: float = DEFAULT_SAMPLE_RATIO,
) -> None:
    """Raise ConfigError (TypeError for unknown names) for `[proxy.tracing]` settings that
    `build_tracer` would refuse, without building a provider or its export thread."""
    check_exporter(exporter)
    if not isinstance(service_name, str) or not service_name:
        raise ConfigError("tracing service_name must be a non-empty string")
    if otlp_endpoint is not None and not isinstance(otlp_endpoint, str):
        raise ConfigError("tracing otlp_endpoint must be a URL string")
    _check_ratio(sample_ratio)


def _check_ratio(sample_ratio: Any) -> None:
    if (
        not isinstance(sample_ratio, int | float)
        or isinstance(sample_ratio, bool)
        or not 0.0 <= sample_ratio <= 1.0
    ):
        raise ConfigError(f"tracing sample_ratio must be between 0 and 1, got {sample_ratio!r}")


def _console_exporter(out: IO[str] | None) -> SpanExporter:
    return ConsoleSpanExporter(
        out=out or sys.stdout,
        formatter=lambda span: span.to_json(indent=None) + "\n",
    )


def build_tracer_provider(
    exporter: str = "none",
    service_name: str = DEFAULT_SERVICE_NAME,
    *,
    otlp_endpoint: str | None = None,
    sample_ratio: float = DEFAULT_SAMPLE_RATIO,
    span_exporter: SpanExporter | None = None,
    out: IO[str] | None = None,
) -> TracerProvider | None:
    """A provider exporting to `exporter`, or None for "none".

    `span_exporter` (tests, embedding) replaces the named exporter and is fed synchronously,
    so finished spans are visible at once. Call `provider.shutdown()` on exit to flush
    (the SDK also does it at interpreter exit).
    """
    if exporter not in EXPORTERS:
        raise ConfigError(
            f"tracing exporter must be one of {', '.join(EXPORTERS)}, got {exporter!r}"
        )
    _check_ratio(sample_ratio)
    if span_exporter is None and exporter == "none":
        return None
    provider = TracerProvider(
        resource=Resource.create({SERVICE_NAME: service_name}),
        sampler=ParentBased(TraceIdRatioBased(sample_ratio)),
    )
    if span_exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    elif exporter == "console":
        provider.add_span_processor(BatchSpanProcessor(_console_exporter(out)))
    else:
        provider.add_span_processor(BatchSpanProcessor(_otlp_exporter(otlp_endpoint)))
    return provider


def build_tracer(
    exporter: str = "none",
    service_name: str = DEFAULT_SERVICE_NAME,
    *,
    otlp_endpoint: str | None = None,
    sample_ratio: float = DEFAULT_SAMPLE_RATIO,
    span_exporter: SpanExporter | None = None,
    out: IO[str] | None = None,
) -> trace.Tracer:
    """The tracer to pass to the proxy app; a no-op tracer when exporter is "none"."""
    provider = build_tracer_provider(
        exporter,
        service_name,
        otlp_endpoint=otlp_endpoint,
        sample_ratio=sample_ratio,
        span_exporter=span_exporter,
        out=out,
    )
    if provider is None:
        return trace.NoOpTracer()
    return provider.get_tracer(TRACER_NAME)
