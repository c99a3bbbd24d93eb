"""The one inference path every protocol calls.

Protocols decode their wire format into numpy tensors, call the data plane,
and encode what comes back.  The data plane resolves the model version and
hands each call to the version's executor (``ModelVersion.executor``:
:class:`~servekit.dataplane.executor.LocalExecutor` in this process, a model
host's client otherwise), which runs the hooks (preprocess, predict/explain/...,
postprocess), turns a hook's failure into :class:`ModelFailure` and a missing
hook into :class:`NotImplementedByModel`.  The call goes one way: the executor
never calls back into the data plane.

What checks a request against its model lives here, not in a protocol:
:func:`check_inputs` (shapes against the metadata), :func:`check_values`
(strings, booleans, NaN and infinity against the declared datatypes), naming a model's outputs
(:func:`named_outputs`), the one way a streamed prediction is joined into a
single answer (:func:`join_stream`), and :meth:`DataPlane.infer`, which runs a
V2 :class:`~servekit.codecs.infer_request.InferRequest` whichever wire it came on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

import numpy as np

from servekit.codecs.infer_request import InferRequest
from servekit.dataplane import batching, call_gate, classification, generation, response_cache, traffic
from servekit.dataplane.executor import LocalExecutor as LocalExecutor  # still importable from here, as before
from servekit.dataplane.repository import ModelRepository, ModelVersion
from servekit.errors import BadRequest, ModelFailure, NotFound, ServekitError, UnknownModel
from servekit.folders import pipeline
from servekit.folders import triton_config as triton_model_config
from servekit.observability import labels, load, request_log, statistics
from servekit.streams import close, is_stream
from servekit.types import GenerationChunk, GenerationRequest, GenerationResult, ModelMetadata, Tensors, TensorSpec

log = logging.getLogger("servekit.dataplane")

#: The name given to a single unnamed output when the metadata names none.
DEFAULT_OUTPUT = "output_0"
#: ``tokenizer=`` left out of a generation: the data plane asks the model's ``tokenizer`` hook.
OWN_TOKENIZER: Any = object()


class DataPlane:
    def __init__(self, repository: ModelRepository, *, load_wait: float = 60.0, strict_readiness: bool = True):
        self.repository = repository
        self.draining = False
        #: Triton's --strict-readiness: every model AVAILABLE (else: one AVAILABLE, every first load done)
        self.strict_readiness = strict_readiness
        #: how long a request waits for this worker's first load instead of failing
        self.load_wait = load_wait
        #: asks the control plane to load a model the memory budget unloaded (ControlPlane.ensure)
        self.on_demand: Any = None
        #: parts of this worker that must be up before it is ready: each says why not, or None
        #: (a requested gRPC port, servekit.server.grpc_engine)
        self.readiness_gates: list[Callable[[], str | None]] = []
        #: where copies of requests for ``shadow:`` candidates go; the server's app installs a
        #: process at idle CPU priority (servekit.hosts.shadow_pipe) beside the request log
        self.shadows: traffic.ShadowRunner = traffic.NoShadows()
        #: the response cache shared by the server's workers (``None``: no model may use one)
        self.response_cache: response_cache.ResponseCache | None = None

    # -- health ---------------------------------------------------------------

    @property
    def live(self) -> bool:
        return True

    @property
    def ready(self) -> bool:
        """Whether this server should get traffic (``/v2/health/ready``, gRPC ``ServerReady``, the status page)."""
        return self.readiness()[0]

    def readiness(self) -> tuple[bool, str]:
        """Readiness and, when not ready, every reason why (a port not open yet and a failed model both)."""
        if self.draining:
            return False, "shutting down (SIGTERM): finishing in-flight requests"
        reasons = [reason for gate in self.readiness_gates if (reason := gate())]
        ready, reason = self.repository.readiness(self.strict_readiness)
        if not ready:
            reasons.append(reason)
        return not reasons, "; ".join(reasons)

    def model_names(self) -> list[str]:
        return sorted(self.repository.models)

    # -- what is loaded here (protocols, pages and observability read it through these) ----

    @property
    def models(self) -> dict[str, Any]:
        """Every model this process knows, by name (:class:`servekit.dataplane.repository.Model`)."""
        return self.repository.models

    @property
    def shared_memory(self) -> Any:
        """The registered system shared-memory regions (:class:`servekit.codecs.shared_memory.Regions`)."""
        return self.repository.shared_memory

    @property
    def plugins(self) -> Any:
        """The plugin manager: the server-wide hooks (``log_request``, ``register_routes``, ...)."""
        return self.repository.pm

    def model(self, name: str) -> Any:
        """One model by name; :class:`UnknownModel` (404) when none is served under it."""
        return self.repository.get_model(name)

    def statuses(self, name: str, version: Any = None, label: str | None = None) -> list[ModelVersion]:
        """The versions a status request addresses, newest first (TF Serving's GetModelStatus)."""
        return self.repository.statuses(name, version, label)

    def resolve_now(self, name: str, version: Any = None) -> ModelVersion:
        """:meth:`resolve` without waiting for a first load (a readiness probe answers at once)."""
        return self.repository.resolve(name, version)

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait for this process's first load; whether it finished in time."""
        return self.repository.wait_ready(timeout)

    def resolve(self, name: str, version: Any = None, label: str | None = None) -> ModelVersion:
        mv = self._resolve(name, version, label)
        if version in (None, "") and label is None and (mv.config.traffic or mv.config.shadow):
            mv = self._steered(mv)
        elif (ticket := traffic.pending()) is not None:
            ticket.routed = ticket.shadow = None  # an earlier request's, never acted on
        ticket = traffic.pending()
        if ticket is not None and not ticket.checked and (ticket.priority or ticket.timeout_ms):
            ticket.checked = True  # the model the request names; a pipeline's steps follow it
            if not call_gate.queues(mv):
                raise BadRequest(
                    f"header {traffic.PRIORITY_HEADER!r} / {traffic.TIMEOUT_HEADER!r} is not supported by model "
                    f"{mv.name!r}: it has no queue to order (give it a 'queue:' in its servekit.yaml)"
                )
        labels.answering_version.set(mv.version)  # the request log's version
        return mv

    def _steered(self, mv: ModelVersion) -> ModelVersion:
        """A request that names no version of a model with ``traffic:`` or ``shadow:`` (servekit.dataplane.traffic)."""
        ticket = traffic.current()
        traffic.start(ticket)
        config = mv.config
        ticket.shadow = (mv.name, config.shadow) if config.shadow is not None else None
        ticket.routed = None
        if config.traffic is None:
            return mv
        target = traffic.route(config.traffic, ticket)
        try:
            chosen = self._target(mv, target)
        except NotFound:
            log.warning("model %s: traffic target %r is not served; the newest version answers", mv.name, target)
            chosen = mv
        ticket.routed = (mv.name, str(target) if chosen is not mv or target == mv.version else str(mv.version))
        return chosen

    def _target(self, mv: ModelVersion, target: int | str) -> ModelVersion:
        """A version of ``mv``'s model (a number) or another model's newest version (a name)."""
        if isinstance(target, int):
            return mv if target == mv.version else self.repository.resolve(mv.name, target)
        return self.repository.resolve(target)

    def _shadow(self, mv: ModelVersion, shadow: tuple[str, Any], inputs: Tensors, kwargs: dict, served: Any) -> None:
        """Hand a copy of a served request to ``shadow:``'s candidate, unless the draw leaves it out."""
        name, config = shadow
        handed = request_log.logged()
        if handed is None or (config.fraction < 1 and traffic.random.random() >= config.fraction):
            return  # nobody keeps the request log: a shadow answer would go nowhere
        try:
            candidate = self._target(self.repository.resolve(name), config.target)
        except ServekitError:
            log.warning("model %s: shadow target %r is not served", name, config.target)
            return
        if candidate is mv:
            return
        answer = served if isinstance(served, dict) else {DEFAULT_OUTPUT: served}
        self.shadows.submit(candidate, (inputs, kwargs), answer, handed.request_log_id, name, f"/shadow/{name}")

    def _resolve(self, name: str, version: Any = None, label: str | None = None) -> ModelVersion:
        if not self.repository.ready:
            # Another worker may already answer ready while this one still loads:
            # hold the request briefly rather than fail it.
            self.repository.wait_ready(self.load_wait)
        try:
            return self.repository.resolve(name, version, label)
        except NotFound:
            model = self.repository.models.get(name)
            if self.on_demand is None or model is None or not model.evicted:
                raise
        self.on_demand(name)  # waits until every worker has it again, or raises 503 with Retry-After
        return self.repository.resolve(name, version, label)

    def metadata(self, mv: ModelVersion) -> ModelMetadata:
        return mv.metadata

    # -- inference ------------------------------------------------------------

    def predict(
        self,
        mv: ModelVersion,
        inputs: Tensors,
        *,
        parameters: dict[str, Any] | None = None,
        signature_name: str | None = None,
        output_names: list[str] | None = None,
    ) -> Any:
        """Run ``predict``; a generator result is returned as is, for streaming.

        The request counts in the load signal (:mod:`servekit.observability.load`)
        from here until it returns, in the process that accepted it: a model host
        runs its workers' requests but does not count them again.
        """
        counted = not load.in_host()
        if counted:
            load.arrived(mv.name)
        ticket = traffic.current()
        routed, shadow = ticket.routed, ticket.shadow  # this request's split and shadow, taken once
        ticket.routed = ticket.shadow = None
        started = time.perf_counter()
        try:
            check_values(mv, inputs, signature_name)
            inputs = single_tensor(mv, inputs)
            cache = self.response_cache
            key = None
            if cache is not None and cache.applies(mv, parameters or {}):
                key = cache.key(mv, inputs, parameters or {}, signature_name, output_names)
            if key is not None:
                assert cache is not None
                cached, looked_up = cache.get(mv, key)
                if not response_cache.missing(cached):
                    return cached
            if isinstance(mv.model, pipeline.Pipeline):  # its steps run on their own versions' executors
                result = self._run_pipeline(mv, inputs, parameters or {})
            else:
                result = mv.executor.predict(
                    mv, inputs, parameters=parameters or {}, signature_name=signature_name, output_names=output_names
                )
            if key is not None and not is_stream(result):
                assert cache is not None
                cache.put(mv, key, result, looked_up)
            pipelined = isinstance(mv.model, pipeline.Pipeline)
            if shadow is not None and not pipelined and not is_stream(result):
                kwargs = {"parameters": parameters, "signature_name": signature_name, "output_names": output_names}
                self._shadow(mv, shadow, inputs, kwargs, result)
            return result
        finally:
            if counted:
                load.left(mv.name)
            if routed is not None:
                traffic.observe_routed(*routed, time.perf_counter() - started)

    @statistics.recorded  # a pipeline request counts like any predict (Triton's ensembles do)
    def _run_pipeline(self, mv: ModelVersion, inputs: Tensors, parameters: dict[str, Any]) -> dict[str, Any]:
        """A pipeline's steps, each an ordinary request to its own model (checked, batched, counted)."""

        def call(step: pipeline.Step, tensors: dict[str, np.ndarray]) -> dict[str, Any]:
            try:
                step_mv = self.resolve(step.model, step.version)
                return self.infer(step_mv, InferRequest(tensors, parameters=dict(parameters)))
            except UnknownModel as exc:
                raise NotFound(f"pipeline {mv.name!r}, step {step.model!r}: {exc.v2_message}") from None
            except ServekitError as exc:
                exc.message = f"pipeline {mv.name!r}, step {step.model!r}: {exc.message}"
                exc.args = (exc.message,)
                raise

        stat = statistics.current()
        return stat.execution(statistics.rows_of(inputs), lambda: pipeline.run(mv.model, inputs, call))

    def infer(self, mv: ModelVersion, request: InferRequest) -> dict[str, np.ndarray]:
        """A V2 request's named outputs; a streaming model's items joined into one answer."""
        result = self._infer(mv, request)
        if is_stream(result):
            result = join_stream(named_outputs(mv, item, request.signature_name) for item in result)
            return classified(mv, request, filter_outputs(result, request.output_names))
        return classified(
            mv, request, filter_outputs(named_outputs(mv, result, request.signature_name), request.output_names)
        )

    def infer_stream(self, mv: ModelVersion, request: InferRequest) -> Iterator[dict[str, np.ndarray]]:
        """A V2 request's named outputs, one dict per item a streaming model yields."""
        result = self._infer(mv, request)
        items = result if is_stream(result) else iter([result])
        try:
            for item in items:
                named = filter_outputs(named_outputs(mv, item, request.signature_name), request.output_names)
                yield classified(mv, request, named)
        finally:
            close(items)  # the client went away: stop the model's generator

    def _infer(self, mv: ModelVersion, request: InferRequest) -> Any:
        priority, timeout = request.scheduling
        if priority is not None or timeout is not None:
            if not call_gate.queues(mv):
                key = "priority" if priority is not None else "timeout"
                raise BadRequest(
                    f"request parameter {key!r} is not supported by model {mv.name!r}: it has no queue to order "
                    "(give it a 'queue:' in its servekit.yaml, or Triton's dynamic_batching priority_levels)"
                )
            traffic.asked(priority, timeout, "request parameter")
        if request.check_shapes:
            check_inputs(mv, request.inputs, request.signature_name)
        return self.predict(
            mv,
            request.inputs,
            parameters=request.parameters,
            signature_name=request.signature_name,
            output_names=request.output_names,
        )

    def explain(
        self,
        mv: ModelVersion,
        inputs: Tensors,
        *,
        parameters: dict[str, Any] | None = None,
        signature_name: str | None = None,
    ) -> Any:
        check_values(mv, inputs, signature_name)
        inputs = single_tensor(mv, inputs)
        return mv.executor.explain(mv, inputs, parameters=parameters or {}, signature_name=signature_name)

    def classify(self, mv: ModelVersion, examples: list[dict], *, parameters=None, signature_name=None):
        result = self._call(
            mv, "classify", examples=examples, parameters=parameters or {}, signature_name=signature_name
        )
        if len(result) != len(examples):
            raise ModelFailure(f"classify returned {len(result)} results for {len(examples)} examples")
        return result

    def regress(self, mv: ModelVersion, examples: list[dict], *, parameters=None, signature_name=None):
        result = self._call(
            mv, "regress", examples=examples, parameters=parameters or {}, signature_name=signature_name
        )
        if len(result) != len(examples):
            raise ModelFailure(f"regress returned {len(result)} results for {len(examples)} examples")
        return result

    # -- generation: the ``complete`` hook's answers, assembled here for every protocol ----------

    def complete(
        self, mv: ModelVersion, request: GenerationRequest, parameters: dict[str, Any] | None = None
    ) -> GenerationResult | str | Iterator[str | GenerationChunk]:
        """Run ``complete`` once, for one choice: what the hook answered, a stream not yet read."""
        return self._call(mv, "complete", request=request, parameters=parameters or {})

    def generate(
        self,
        mv: ModelVersion,
        requests: Iterable[GenerationRequest],
        parameters: dict[str, Any] | None = None,
        *,
        tokenizer: Any = OWN_TOKENIZER,
    ) -> generation.Generated:
        """Every choice of a generation request, whole: ``complete`` once per (prompt, choice),
        stop sequences cut, the tokens the model did not report counted, the usage summed.

        ``tokenizer``: the model's, when the protocol already has it (a chat prompt is
        formatted with it); left out, the data plane asks the ``tokenizer`` hook.
        """
        arrived = time.monotonic()
        tokenizer = self.tokenizer(mv) if tokenizer is OWN_TOKENIZER else tokenizer
        return generation.generate_whole(requests, self._completer(mv, parameters), tokenizer, mv.name, arrived)

    def generate_stream(
        self,
        mv: ModelVersion,
        requests: Iterable[GenerationRequest],
        parameters: dict[str, Any] | None = None,
        *,
        tokenizer: Any = OWN_TOKENIZER,
    ) -> Generator[generation.StreamEvent, None, None]:
        """Every choice of a generation request, streamed in turn (:func:`generation.stream_choices`).

        A choice's ``complete`` call is made when the stream reaches it, so the first
        event the consumer pulls makes the first call (a refusal raises there).  Closing
        the stream (client gone) closes the model's generator.
        """
        arrived = time.monotonic()  # the first token is timed from here, not from the first event asked for
        tokenizer = self.tokenizer(mv) if tokenizer is OWN_TOKENIZER else tokenizer
        return generation.stream_choices(requests, self._completer(mv, parameters), tokenizer, mv.name, arrived)

    def _completer(self, mv: ModelVersion, parameters: dict[str, Any] | None) -> generation.Start:
        return lambda request: self.complete(mv, request, parameters)

    def embed(self, mv: ModelVersion, texts: list[str], parameters: dict[str, Any] | None = None) -> Any:
        """Run ``embed``; with the version's batching on, concurrent requests share one call.

        Requests whose bodies agree but for ``input`` are merged (the adaptive
        batcher's rules, texts stacked in arrival order) and the hook then gets
        the shared fields as ``parameters``, without ``input``: the texts it
        embeds are ``texts``.
        """
        parameters = parameters or {}
        batcher = batching.batcher_for(mv)
        shared = {k: v for k, v in parameters.items() if k != "input"}
        key = batching.options_key(shared, "embed", None) if batcher is not None else None
        if batcher is None or key is None:
            return self._call(mv, "embed", texts=texts, parameters=parameters)
        rows = np.empty(len(texts), dtype=object)
        rows[:] = texts  # strings (token-id inputs keep their ids) stacked like any rows

        def run(stacked: Any) -> Any:
            return self._call(mv, "embed", texts=list(stacked), parameters=shared)

        return batcher.submit(rows, run, key)

    def tokenizer(self, mv: ModelVersion) -> Any | None:
        """The model's tokenizer (the ``tokenizer`` hook), ``None`` when it has none.

        Generation cuts stop sequences and counts tokens with it; OpenAI's token-id
        inputs are checked against its vocabulary.
        """
        try:
            return mv.hooks.tokenizer(model=mv.model)
        except ServekitError:
            raise
        except Exception as exc:
            raise ModelFailure(f"model {mv.name!r} failed in tokenizer: {type(exc).__name__}: {exc}") from exc

    # -- helpers ----------------------------------------------------------------

    def call_hook(self, mv: ModelVersion, hook: str, **kwargs: Any) -> Any:
        """One of the model's hooks, wherever the version runs (a model host calls this for its workers)."""
        return self._call(mv, hook, **kwargs)

    def _call(self, mv: ModelVersion, hook: str, **kwargs: Any) -> Any:
        with mv.in_use():  # raises NotReady when it is not serving
            return mv.executor.hook(mv, hook, **kwargs)


def check_inputs(mv: ModelVersion, inputs: Tensors, signature_name: str | None) -> None:
    """Refuse an input whose shape contradicts the model's metadata (``-1``: any size).

    Only inputs the signature names, with a known shape, are checked; datatypes
    are left to the model, which converts what it can.  A declared shape of
    ``[]`` is not checked either: older SavedModels write an empty shape where
    they mean "unknown" (TF Serving's own half_plus_three does), and TF Serving
    does not hold requests to it.
    """
    signature = mv.metadata.signature(signature_name)
    if signature is None or not isinstance(inputs, dict):
        return
    for spec in signature.inputs:
        arr = inputs.get(spec.name)
        if arr is None or not spec.shape:
            continue
        if len(spec.shape) != arr.ndim or any(d >= 0 and d != a for d, a in zip(spec.shape, arr.shape)):
            raise BadRequest(
                f"input {spec.name!r}: shape {list(arr.shape)} does not match the model's shape "
                f"{spec.shape} (-1 means any size)"
            )


#: V2 datatypes of numbers: a string or a boolean sent to one of these is a client's mistake
NUMERIC_DATATYPES = frozenset(
    {"FP16", "BF16", "FP32", "FP64", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"}
)


def check_values(mv: ModelVersion, inputs: Tensors, signature_name: str | None) -> None:
    """Refuse values the model's metadata rules out, before the model sees them.

    An input declared as numbers (:data:`NUMERIC_DATATYPES`) refuses strings and
    booleans; NaN and ±Infinity only where the input declares it takes them
    (``TensorSpec.allow_nan``, ``allow_infinity``; an integer input takes neither).
    Every protocol's request comes through here, so a value is refused alike on
    V1, V2 and gRPC, whichever plugin serves the model.

    Unnamed rows (V1 ``instances``) are the input of a one-input signature.  A
    tensor the signature does not name is left to the model, but for the one
    tensor of rows that a signature of one input per feature takes under any
    name (as KServe's and MLServer's runtimes take the first tensor as the
    feature matrix): it is checked as the features, its columns named by them.
    A pipeline's steps check their own inputs.
    """
    if isinstance(mv.model, pipeline.Pipeline):
        return
    signature = mv.metadata.signature(signature_name)
    if signature is None or not signature.inputs:
        return
    declared = signature.inputs
    if not isinstance(inputs, dict):
        if len(declared) == 1:
            _check_tensor(inputs, declared[0], f"input {declared[0].name!r}")
        else:
            _check_rows(inputs, declared, "input")
        return
    specs = {spec.name: spec for spec in declared}
    for name, value in inputs.items():
        spec = specs.get(name)
        if spec is not None:
            _check_tensor(value, spec, f"input {name!r}")
    if len(inputs) == 1 and len(declared) > 1:
        ((name, value),) = inputs.items()
        if name not in specs:
            _check_rows(value, declared, f"input {name!r}")


def _check_rows(value: Any, declared: list[TensorSpec], label: str) -> None:
    """One tensor of rows for a signature of one input per feature, when the features agree on what they take."""
    first = declared[0]
    if any(
        (s.datatype, s.allow_nan, s.allow_infinity) != (first.datatype, first.allow_nan, first.allow_infinity)
        for s in declared
    ):
        return
    arr = np.asarray(value)
    columns = [s.name for s in declared] if arr.ndim == 2 and arr.shape[1] == len(declared) else None
    _check_tensor(arr, first, label, columns)


def _check_tensor(value: Any, spec: TensorSpec, label: str, columns: list[str] | None = None) -> None:
    if spec.datatype not in NUMERIC_DATATYPES:
        return
    arr = value if isinstance(value, np.ndarray) else np.asarray(value)
    kind = arr.dtype.kind
    if kind == "b":
        raise BadRequest(f"{label}: expected numbers ({spec.datatype}), found booleans")
    if kind in "OSU":
        text = _first_text(arr)
        if text is not None:
            index, found = text
            where, at = _locate(label, columns, index)
            raise BadRequest(f"{where}: expected numbers, found {found}{at}")
        return
    if kind not in "fc":
        return
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(arr.sum()):  # finite only when every value is (a sum that overflows looks closer)
            return
    floating = spec.datatype.startswith(("FP", "BF"))
    refused = ~np.isfinite(arr)
    if floating and spec.allow_nan:
        refused &= ~np.isnan(arr)
    if floating and spec.allow_infinity:
        refused &= ~np.isinf(arr)
    if not refused.any():
        return
    index = tuple(int(i) for i in np.argwhere(refused)[0])
    where, at = _locate(label, columns, index)
    if np.isnan(arr[index]):
        raise BadRequest(
            f"{where} contains NaN{at}; this model does not take missing values "
            "(only an input declared with allow_nan does): send numbers"
        )
    hint = "; send NaN for a missing value" if floating and spec.allow_nan else ""
    raise BadRequest(f"{where} contains infinity{at}; this model takes only finite numbers{hint}")


def _first_text(arr: np.ndarray) -> tuple[tuple[int, ...], str] | None:
    """Where the first string of an array is, and how to show it; ``None`` when it holds only numbers."""
    if arr.dtype.kind == "O":
        flat = arr.reshape(-1)
        for i, item in enumerate(flat):
            if isinstance(item, (str, bytes)) or not isinstance(item, (int, float, complex, np.number)):
                return tuple(int(v) for v in np.unravel_index(i, arr.shape)), _show(item)
        return None
    if arr.size == 0:
        return None
    first = (0,) * arr.ndim
    return first, _show(arr[first] if arr.ndim else arr.item())


def _show(item: Any) -> str:
    if isinstance(item, bytes):
        item = item.decode("utf-8", "replace")
    if isinstance(item, str):
        return f"the string {item[:40]!r}"
    return f"a {type(item).__name__}"


def _locate(label: str, columns: list[str] | None, index: tuple[int, ...]) -> tuple[str, str]:
    """How a message names a value: the input (its feature, for rows of features) and where in it."""
    if columns is not None:
        return f"input {columns[index[1]]!r}", f" at row {index[0]}"
    if not index:
        return label, ""
    if len(index) == 1:
        return label, f" at row {index[0]}"
    if len(index) == 2:
        return label, f" at row {index[0]} column {index[1]}"
    return label, f" at index {list(index)}"


def single_tensor(mv: ModelVersion, inputs: Tensors) -> Tensors:
    """A request's only tensor as one array when the model's metadata declares no inputs.

    V1 rows arrive as one array, V2 and gRPC always name their tensors; without
    this, a ``model.py`` written for one array would answer V1 and fail on the
    others.  A model that declares its inputs gets them by name, as declared.
    """
    if not isinstance(inputs, dict) or len(inputs) != 1:
        return inputs
    if any(sig.inputs for sig in mv.metadata.signatures.values()):
        return inputs
    (array,) = inputs.values()
    return array


def named_outputs(mv: ModelVersion, outputs: Any, signature_name: str | None = None) -> dict[str, np.ndarray]:
    """Outputs as named arrays, for protocols that always name tensors (V2, gRPC).

    A single unnamed output takes the signature's one output name, else ``output_0``.
    """
    if isinstance(outputs, dict):
        return {str(k): _as_array(v, str(k)) for k, v in outputs.items()}
    name = DEFAULT_OUTPUT
    signature = mv.metadata.signature(signature_name)
    if signature is not None and len(signature.outputs) == 1:
        name = signature.outputs[0].name
    return {name: _as_array(outputs, name)}


def _as_array(value: Any, name: str) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    try:
        return np.asarray(value)
    except ValueError:
        raise ModelFailure(f"output {name!r} is not a rectangular tensor") from None


def classified(mv: ModelVersion, request: InferRequest, outputs: dict[str, Any]) -> dict[str, Any]:
    """Outputs requested with Triton's ``classification`` parameter as their top classes."""
    wanted = {o.name: o.classification for o in request.outputs or () if o.classification}
    if not wanted:
        return outputs
    signature = mv.metadata.signature(request.signature_name)
    specs = {spec.name: spec for spec in signature.outputs} if signature is not None else {}
    batched = triton_model_config.batch_size(mv) > 0  # the batch dimension Triton's configuration reports
    out = dict(outputs)
    for name, count in wanted.items():
        spec = specs.get(name)
        labels = classification.labels_for(mv, name, spec.labels if spec is not None else None)
        try:
            out[name] = classification.top_classes(_as_array(out[name], name), count, batched=batched, labels=labels)
        except BadRequest as exc:
            raise BadRequest(f"output {name!r}: {exc.message}") from None
    return out


def filter_outputs(outputs: dict[str, Any], requested: list[str] | None) -> dict[str, Any]:
    """Keep the requested outputs, in the order asked; an unknown name is a client error."""
    if not requested:
        return outputs
    missing = [n for n in requested if n not in outputs]
    if missing:
        raise BadRequest(f"unknown output(s) {', '.join(missing)}; the model returns {', '.join(outputs) or 'none'}")
    return {n: outputs[n] for n in requested}


def join_stream(items: Iterable[Any], *, lenient: bool = False) -> Any:
    """A streaming model's items as one answer: each output concatenated along its first axis.

    Used where the protocol has room for one response only (unary ``Predict`` and
    ``ModelInfer``, V2 over HTTP, V1 without ``stream``, ``return_single_response``).
    Items are named outputs (every item with the same names) or plain arrays;
    scalar items are stacked.  Items that cannot be joined are a
    :class:`ModelFailure`, or, with ``lenient`` (TF Serving's JSON, which can
    carry any list), the list of items as they came.
    """
    collected = list(items)
    try:
        if collected and all(isinstance(i, dict) for i in collected):
            return _join_named(collected)
        if collected and all(isinstance(i, (np.ndarray, np.generic, int, float)) for i in collected):
            return _concatenate([np.atleast_1d(i) for i in collected])
        if not collected:
            raise ModelFailure("the model's stream produced no items")
        raise ModelFailure("a streamed item is neither a tensor nor named tensors; cannot join them")
    except ModelFailure:
        if lenient:
            return collected
        raise


def _join_named(items: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    names = list(items[0])
    parts: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for item in items:
        if sorted(item) != sorted(names):
            raise ModelFailure(
                f"a streamed item has outputs {sorted(item)}, the first had {sorted(names)}; cannot join them"
            )
        for n in names:
            parts[n].append(np.atleast_1d(item[n]))
    return {n: _concatenate(chunks) for n, chunks in parts.items()}


def _concatenate(chunks: list[np.ndarray]) -> np.ndarray:
    try:
        return np.concatenate(chunks, axis=0)
    except ValueError as exc:
        raise ModelFailure(f"cannot join the model's streamed items along their first axis: {exc}") from None
