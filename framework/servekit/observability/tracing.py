"""OpenTelemetry traces: a server span per request, child spans for each stage, across model hosts.

Off unless the standard ``OTEL_*`` variables ask for traces
(``pip install 'servekit[otel]'``)::

    OTEL_TRACES_EXPORTER=otlp OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318 servekit serve models/

Traces are on when ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp``,
``console``; ``none`` is off) or an OTLP endpoint is set
(``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), and
``OTEL_SDK_DISABLED`` is not ``true``.  Everything else is the SDK's own reading
of the variables: ``OTEL_SERVICE_NAME`` (default ``servekit``),
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER`` / ``_ARG`` (default
``parentbased_always_on``), ``OTEL_PROPAGATORS`` (default W3C ``traceparent``),
``OTEL_BSP_*`` for the batching export, ``OTEL_EXPORTER_OTLP_HEADERS`` etc.
OTLP goes over HTTP/protobuf; ``OTEL_EXPORTER_OTLP_PROTOCOL=grpc`` uses the gRPC
exporter when ``opentelemetry-exporter-otlp-proto-grpc`` is installed.

Off, nothing is imported and every place that could trace checks :data:`ON`
(one module attribute) first, so requests pay nothing measurable
(bench/RESULTS.md).

The spans of one V2 request through a model host::

    POST /v2/models/{name}/infer           SERVER  (HTTP middleware / gRPC interceptor)
      servekit.decode
      servekit.queue                       the batcher: waiting for batch-mates, and the call
        servekit.host                      CLIENT: the call handed to a model host
          servekit.host.serve              SERVER, in the model host process
            servekit.predict               the model's predict: batch size, rows, version, device
      servekit.encode
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

log = logging.getLogger("servekit.tracing")

#: Whether traces are recorded in this process (set by :func:`configure`).
ON = False

_tracer: Any = None
_provider: Any = None
#: the OpenTelemetry API modules, imported by :func:`configure` (never while traces are off)
trace: Any = None
context: Any = None
propagate: Any = None
_NOOP = contextlib.nullcontext()

#: attribute names used on servekit's spans
MODEL, VERSION, ROWS, BATCH_SIZE, DEVICE = (
    "servekit.model",
    "servekit.model_version",
    "servekit.rows",
    "servekit.batch_size",
    "servekit.device",
)
HOST_PID, HOST_REPLICA = "servekit.host.pid", "servekit.host.replica"


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the ``OTEL_*`` variables ask for traces."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return any(e.strip() not in ("", "none") for e in exporters.split(","))
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def configure(exporters: list[Any] | None = None, *, simple: bool = False) -> bool:
    """Turn traces on when the environment asks (or ``exporters`` are given); whether they are on.

    Called once per process (the app, a model host); ``exporters`` and ``simple``
    (export each span as it ends, not in batches) are for tests.  A second call
    with exporters replaces the first (the SDK's global provider is set once, so
    servekit keeps its own).
    """
    global ON, _tracer, _provider, trace, context, propagate
    if exporters is None and (ON or not wanted()):
        return ON  # configured already (the app and the gRPC server share the process's provider)
    try:
        from opentelemetry import context, propagate, trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    except ImportError:
        log.warning("OTEL_* variables ask for traces, but the SDK is missing: pip install 'servekit[otel]'")
        return False
    if exporters is None:
        exporters = _exporters_from_env()
    attributes = {}
    named = "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    if not os.environ.get("OTEL_SERVICE_NAME") and not named:
        attributes["service.name"] = "servekit"
    from servekit.version import __version__

    attributes["service.version"] = __version__
    provider = TracerProvider(resource=Resource.create(attributes))
    for exporter in exporters:
        provider.add_span_processor(SimpleSpanProcessor(exporter) if simple else BatchSpanProcessor(exporter))
    if _provider is not None:
        _provider.shutdown()
    _provider = provider
    _tracer = provider.get_tracer("servekit")
    ON = bool(exporters)
    return ON


def _exporters_from_env() -> list[Any]:
    names = [n.strip() for n in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").lower().split(",") if n.strip()]
    found: list[Any] = []
    for name in names:
        if name == "none":
            continue
        if name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            found.append(ConsoleSpanExporter())
        elif name == "otlp":
            found.append(_otlp_exporter())
        else:
            log.warning("OTEL_TRACES_EXPORTER: unknown exporter %r (servekit knows otlp, console, none)", name)
    return found


def _otlp_exporter() -> Any:
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
    )
    if protocol.strip().lower() == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

            return GrpcExporter()
        except ImportError:
            log.warning("OTLP over gRPC needs opentelemetry-exporter-otlp-proto-grpc; exporting over HTTP")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def shutdown() -> None:
    """Export what is left (a worker or host about to exit)."""
    if _provider is not None:
        _provider.shutdown()


def force_flush(timeout_ms: int = 5000) -> bool:
    return bool(_provider.force_flush(timeout_ms)) if _provider is not None else True


# -- spans -----------------------------------------------------------------------------------


def span(name: str, attributes: dict[str, Any] | None = None) -> Any:
    """A child span of the current one, as a context manager (a no-op when traces are off)."""
    if not ON:
        return _NOOP
    return _tracer.start_as_current_span(name, attributes=attributes)


def set_attributes(attributes: dict[str, Any]) -> None:
    """Add attributes to the current span (nothing when traces are off)."""
    if ON:
        trace.get_current_span().set_attributes(attributes)


def extract(carrier: Mapping[str, str]) -> Any:
    """The caller's context from W3C ``traceparent``/``tracestate`` (keys lower case)."""

    return propagate.extract(carrier)


def environ_carrier(environ: Mapping[str, Any]) -> dict[str, str]:
    """A WSGI environ's trace headers, as the propagator reads them."""
    carrier = {}
    for key in ("traceparent", "tracestate", "baggage"):
        value = environ.get("HTTP_" + key.upper())
        if value:
            carrier[key] = value
    return carrier


class ServerSpan:
    """A request's server span: current from :meth:`enter` to :meth:`leave`, ended by :meth:`end`.

    The span outlives the call that made it: a streamed answer ends it when
    its last byte is sent, possibly in another thread.
    """

    __slots__ = ("span", "_token")

    def __init__(self, name: str, carrier: Mapping[str, str], attributes: dict[str, Any] | None = None):

        caller = extract(carrier) if carrier else None  # no header: a new trace
        self.span = _tracer.start_span(name, context=caller, kind=trace.SpanKind.SERVER, attributes=attributes)
        self._token: Any = None

    def enter(self) -> None:

        self._token = context.attach(trace.set_span_in_context(self.span))

    def leave(self) -> None:

        if self._token is not None:
            with contextlib.suppress(ValueError):  # detached in another context: nothing to undo
                context.detach(self._token)
            self._token = None

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        self.enter()
        try:
            yield
        finally:
            self.leave()

    def end(self, status_code: int | None = None, error: str | None = None, attributes: dict | None = None) -> None:

        if attributes:
            self.span.set_attributes(attributes)
        if status_code is not None:
            self.span.set_attribute("http.response.status_code", status_code)
            if status_code >= 500:
                self.span.set_status(trace.Status(trace.StatusCode.ERROR, error))
        elif error:
            self.span.set_status(trace.Status(trace.StatusCode.ERROR, error))
        self.span.end()

    @property
    def trace_id(self) -> str:
        return format(self.span.get_span_context().trace_id, "032x")


def inject() -> dict[str, str]:
    """The current context as ``traceparent`` (and ``tracestate``) for a call to another process."""
    if not ON:
        return {}

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


@contextlib.contextmanager
def continued(carrier: Mapping[str, str] | None, name: str, attributes: dict[str, Any] | None = None) -> Iterator[Any]:
    """A server span continuing ``carrier``'s trace (a model host serving a worker's call), current inside."""
    if not ON or not carrier:
        yield None
        return

    with _tracer.start_as_current_span(
        name, context=extract(carrier), kind=trace.SpanKind.SERVER, attributes=attributes
    ) as current:
        yield current


def client_span(name: str, attributes: dict[str, Any] | None = None) -> Any:
    """A CLIENT span (a call handed to another process), current inside; no-op when off."""
    if not ON:
        return _NOOP

    return _tracer.start_as_current_span(name, kind=trace.SpanKind.CLIENT, attributes=attributes)


def current_ids() -> tuple[str, str]:
    """The current trace and span ids in hex, ``("", "")`` outside a recorded span."""
    if not ON:
        return "", ""

    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return "", ""
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


def current_trace_id() -> str:
    return current_ids()[0]
