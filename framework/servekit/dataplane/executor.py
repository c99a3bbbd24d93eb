"""Where a version's calls run when it is loaded in this process: the executor side of the data plane.

The data plane decides what a request is (the version, its tensors, the load
signal, a pipeline's steps) and hands the call to the version's executor,
``ModelVersion.executor`` (a :class:`servekit.types.Executor`): the
:class:`LocalExecutor` here for a version loaded in this process, or
:class:`servekit.hosts.client.HostClient` for one in model hosts.  The
executor runs the hooks (preprocess, the call batched or gated or in its
sequence, postprocess), turns a hook's failure into :class:`ModelFailure` and
a missing hook into :class:`NotImplementedByModel`, and never calls back into
the data plane: a request crosses the seam once, one way.  A model host serves
its workers' calls through a :class:`LocalExecutor` too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from servekit.dataplane import batching, call_gate, sequences
from servekit.errors import ModelFailure, NotImplementedByModel, ServekitError
from servekit.observability import load, statistics, tracing
from servekit.streams import is_stream
from servekit.types import LoadedVersion, ModelOutputs, Tensors

log = logging.getLogger("servekit.dataplane")


class LocalExecutor:
    """A version loaded in this process: its hooks run here, in the caller's thread (or its batch's).

    It holds no state of its own (the batcher, the gate and the sequences hang on
    the version), so one instance, :data:`LOCAL`, serves every version.
    """

    #: the version computes in this process (its gate and queue are here)
    local = True

    @statistics.recorded  # Triton's statistics extension (statistics.py)
    def predict(
        self,
        mv: LoadedVersion,
        inputs: Tensors,
        *,
        parameters: dict[str, Any],
        signature_name: str | None,
        output_names: list[str] | None,
    ) -> ModelOutputs:
        """``predict`` for one request; a generator result is returned as is, for streaming."""
        arrival = load.arrival()
        stat = statistics.current()
        live = sequences.sequences_of(mv)
        sequence = live.open(parameters) if live is not None else None
        if sequence is not None:  # a sequence's requests run alone, one at a time, on its state
            assert live is not None
            try:
                inputs = live.with_controls(sequence, inputs)  # Triton's control_input tensors, if declared
                inputs, run = self._prepared(mv, stat, inputs, parameters, signature_name, output_names, sequence)
                return _outputs(mv, stat, run(inputs), parameters)
            finally:
                live.close(sequence)
        inputs, run = self._prepared(mv, stat, inputs, parameters, signature_name, output_names)
        batcher = batching.batcher_for(mv)
        options = batching.options_key(parameters, signature_name, output_names) if batcher else None
        if batcher is None or options is None:
            with call_gate.turn(mv), load.running(mv.name, [arrival]):  # the wait for a place is queueing
                outputs = run(inputs)
        elif call_gate.queues(mv):  # a priority queue in front of the batcher: a batch's worth pass at once
            with tracing.span("servekit.queue"), call_gate.turn(mv):
                outputs = batcher.submit(inputs, run, options, arrival=arrival)
        else:
            with tracing.span("servekit.queue"):
                outputs = batcher.submit(inputs, run, options, arrival=arrival)  # waits for batch-mates, then the call
        return _outputs(mv, stat, outputs, parameters)

    def predict_together(self, mv: LoadedVersion, calls: list[tuple[Tensors, dict[str, Any]]]) -> list[tuple[Any, Any]]:
        """Several ``predict`` requests of a batching version at once, in this thread (a model host's loop).

        ``calls`` holds each request's inputs and keyword arguments (those of
        :meth:`predict`, and ``arrival``: when it arrived in its worker); they share calls as the batcher's rules allow
        (:meth:`Batcher.run_together`).  Returns ``(result, None)`` or
        ``(None, exception)`` per request, in order; each is counted in the
        statistics like a :meth:`predict`.
        """
        batcher = batching.batcher_for(mv)
        if batcher is None:
            raise RuntimeError(f"model {mv.name!r} does not batch")
        outcomes: list[tuple[Any, Any]] = [(None, None)] * len(calls)
        prepared = []
        for i, (raw, kwargs) in enumerate(calls):
            stat = statistics.Request(mv.name, str(mv.version))
            parameters = kwargs.get("parameters") or {}
            signature_name, output_names = kwargs.get("signature_name"), kwargs.get("output_names")
            try:
                inputs, run = self._prepared(mv, stat, raw, parameters, signature_name, output_names)
            except BaseException as exc:
                stat.finish(False, 0)
                outcomes[i] = (None, exc)
                continue
            options = batching.options_key(parameters, signature_name, output_names)
            arrival = kwargs.get("arrival") or time.monotonic()
            prepared.append((i, stat, raw, parameters, (inputs, run, options, arrival)))
        members = batcher.run_together([entry[-1] for entry in prepared])
        for (i, stat, raw, parameters, _), member in zip(prepared, members):
            try:
                if member.error is not None:
                    raise member.error
                outcomes[i] = (_outputs(mv, stat, member.result, parameters), None)
            except BaseException as exc:
                stat.finish(False, 0)
                outcomes[i] = (None, exc)
                continue
            stat.finish(True, statistics.rows_of(raw))
        return outcomes

    def explain(
        self, mv: LoadedVersion, inputs: Tensors, *, parameters: dict[str, Any], signature_name: str | None
    ) -> ModelOutputs:
        inputs = _preprocess(mv, inputs, parameters)
        return self.call_hook(mv, "explain", inputs=inputs, parameters=parameters, signature_name=signature_name)

    def call_hook(self, mv: LoadedVersion, name: str, **kwargs: Any) -> Any:
        """:meth:`hook`, holding the version for the call (it is not unloaded under it)."""
        with mv.in_use():  # raises NotReady when it is not serving
            return self.hook(mv, name, **kwargs)

    def hook(self, mv: LoadedVersion, name: str, **kwargs: Any) -> Any:
        """One of the model's hooks, by name; the data plane holds the version around it."""
        caller = getattr(mv.hooks, name)
        if not caller.get_hookimpls():
            raise NotImplementedByModel(f"model {mv.name!r} does not implement {name!r}")
        try:
            result = caller(model=mv.model, name=mv.name, version=mv.version, **kwargs)
        except ServekitError:
            raise
        except Exception as exc:
            log.warning("model %s raised in %s: %s", mv.name, name, exc, exc_info=log.isEnabledFor(logging.DEBUG))
            raise ModelFailure(f"model {mv.name!r} failed in {name}: {type(exc).__name__}: {exc}") from exc
        if result is None:
            raise NotImplementedByModel(f"model {mv.name!r} does not implement {name!r}")
        return result

    def close(self) -> None:
        return None

    def _prepared(
        self,
        mv: LoadedVersion,
        stat: statistics.Request,
        inputs: Tensors,
        parameters: dict[str, Any],
        signature_name: str | None,
        output_names: list[str] | None,
        sequence: sequences.Sequence | None = None,
    ) -> tuple[Tensors, batching.Runner]:
        """A request's preprocessed inputs and the call of the ``predict`` hook that serves it (or its batch)."""
        inputs = stat.time("compute_input", _preprocess, mv, inputs, parameters)

        def run(batch: Tensors) -> Any:
            if tracing.ON:
                attributes = _model_call(mv, statistics.rows_of(inputs), statistics.rows_of(batch))
                with tracing.span("servekit.predict", attributes):
                    return call(batch)
            return call(batch)

        def call(batch: Tensors) -> Any:
            return stat.execution(
                statistics.rows_of(batch),
                lambda: self.call_hook(
                    mv,
                    "predict",
                    inputs=batch,
                    parameters=parameters,
                    signature_name=signature_name,
                    output_names=output_names,
                    sequence=sequence,
                ),
            )

        stat.submitted()
        return inputs, run


#: The executor of every version loaded in this process (``ModelVersion.executor``'s default).
LOCAL = LocalExecutor()


def _outputs(mv: LoadedVersion, stat: statistics.Request, outputs: Any, parameters: dict[str, Any]) -> Any:
    if is_stream(outputs):
        return _guarded(mv, outputs)
    return stat.time("compute_output", _postprocess, mv, outputs, parameters)


def _preprocess(mv: LoadedVersion, inputs: Tensors, parameters: dict[str, Any]) -> Tensors:
    if not mv.hooks.preprocess.get_hookimpls():
        return inputs
    mapped = _optional(mv, "preprocess", inputs=inputs, parameters=parameters)
    return inputs if mapped is None else mapped


def _postprocess(mv: LoadedVersion, outputs: Any, parameters: dict[str, Any]) -> Any:
    if not mv.hooks.postprocess.get_hookimpls():
        return outputs
    mapped = _optional(mv, "postprocess", outputs=outputs, parameters=parameters)
    return outputs if mapped is None else mapped


def _optional(mv: LoadedVersion, hook: str, **kwargs: Any) -> Any:
    """A hook a model need not implement (``None`` keeps what it was given)."""
    try:
        return getattr(mv.hooks, hook)(model=mv.model, name=mv.name, version=mv.version, **kwargs)
    except ServekitError:
        raise
    except Exception as exc:
        raise ModelFailure(f"model {mv.name!r} failed in {hook}: {type(exc).__name__}: {exc}") from exc


def _guarded(mv: LoadedVersion, items: Iterator[Any]) -> Iterator[Any]:
    """A streaming model's generator, its failures reported like any hook's (closing is passed on)."""
    try:
        yield from items
    except ServekitError:
        raise
    except Exception as exc:
        log.warning("model %s raised while streaming: %s", mv.name, exc)
        raise ModelFailure(f"model {mv.name!r} failed in predict: {type(exc).__name__}: {exc}") from exc


def _model_call(mv: LoadedVersion, rows: int, batch_rows: int) -> dict[str, Any]:
    """The model call span's attributes: the request's rows within the batch the model was given."""
    return {
        tracing.MODEL: mv.name,
        tracing.VERSION: str(mv.version),
        tracing.ROWS: rows,
        tracing.BATCH_SIZE: batch_rows,
        tracing.DEVICE: str(getattr(mv.config, "device", "") or "auto"),
    }
