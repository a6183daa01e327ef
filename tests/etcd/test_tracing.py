"""proxy.tracing: exporter selection, provider isolation, attributes, sampling."""

from __future__ import annotations

import importlib.util
import io

import orjson
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from chainstate.config import ConfigError
from proxy.tracing import build_tracer, build_tracer_provider, check_exporter


def test_spans_reach_the_given_exporter_with_attributes() -> None:
    exporter = InMemorySpanExporter()
    tracer = build_tracer("none", "proxy-test", span_exporter=exporter)
    attributes = {"client_id": "acme", "x_vendor_env": "prod"}
    with tracer.start_as_current_span("jsonrpc.request", attributes=attributes):
        for attempt in (1, 2):
            with tracer.start_as_current_span(
                "upstream.attempt", attributes={"node": f"n{attempt}", "attempt": attempt}
            ):
                pass
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["upstream.attempt", "upstream.attempt", "jsonrpc.request"]
    root = spans[2]
    assert dict(root.attributes or {}) == attributes
    assert root.resource.attributes["service.name"] == "proxy-test"
    assert all(s.parent and s.parent.span_id == root.context.span_id for s in spans[:2])
    assert [s.attributes["attempt"] for s in spans[:2]] == [1, 2]  # type: ignore[index]


def test_the_global_provider_is_left_alone() -> None:
    before = trace.get_tracer_provider()
    build_tracer("console", out=io.StringIO())
    assert trace.get_tracer_provider() is before


def test_none_is_a_no_op() -> None:
    assert build_tracer_provider("none") is None
    tracer = build_tracer()
    with tracer.start_as_current_span("x") as span:
        assert not span.is_recording()


def test_console_writes_one_json_object_per_span() -> None:
    out = io.StringIO()
    provider = build_tracer_provider("console", "console-test", out=out)
    assert provider is not None
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("a"), tracer.start_as_current_span("b"):
        pass
    provider.force_flush()
    lines = out.getvalue().splitlines()
    assert [orjson.loads(line)["name"] for line in lines] == ["b", "a"]
    provider.shutdown()


def test_sample_ratio_zero_records_nothing() -> None:
    exporter = InMemorySpanExporter()
    tracer = build_tracer(span_exporter=exporter, sample_ratio=0.0)
    with tracer.start_as_current_span("a"):
        pass
    assert exporter.get_finished_spans() == ()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"exporter": "jaeger"}, "one of none, console, otlp"), ({"sample_ratio": 1.5}, "between")],
)
def test_bad_settings_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_tracer(**kwargs)


@pytest.mark.skipif(
    importlib.util.find_spec("opentelemetry.exporter") is not None,
    reason="an OTLP exporter is installed here",
)
def test_otlp_without_the_package_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="pip install opentelemetry-exporter-otlp"):
        build_tracer("otlp")
    with pytest.raises(ConfigError, match="pip install"):
        check_exporter("otlp")


def test_check_exporter_accepts_what_works_and_refuses_unknown_names() -> None:
    check_exporter("none")
    check_exporter("console")
    with pytest.raises(ConfigError, match="one of"):
        check_exporter("zipkin")
