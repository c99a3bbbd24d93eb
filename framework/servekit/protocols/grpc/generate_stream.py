"""Generative models over V2 gRPC, answered as Triton's vLLM and TensorRT-LLM backends answer.

A ``ModelInferRequest`` with a BYTES input ``text_input`` to a model that has a
``complete`` hook is a generate request: the other inputs (``stream``,
``sampling_parameters``, ``exclude_input_in_output``, ``return_finish_reason``
..., or scalar settings such as ``max_tokens``) and the request parameters
are read by :mod:`..generate_requests`, as over HTTP.  ``ModelStreamInfer``
answers one response per produced piece, its output ``text_output`` (BYTES,
shape ``[1]``) holding the new text (a decoupled model's way); a ``stream``
input set to false gets one response with the whole text, and so does
``ModelInfer``.  A model without ``complete`` takes the request as an ordinary
inference (a text classifier may well name its input ``text_input``).

Within one ``ModelStreamInfer`` call, generate requests run at once (each in a
thread, all in the model's one batch) and their responses interleave, told
apart by ``id``, as from a decoupled Triton model; other requests still answer
one after another, in order (:class:`Interleave`).

A cancelled call (the client's ``stop_stream(cancel_requests=True)``, a
deadline, a dropped connection) ends the loop at the next piece: the model's
generator is closed and the scheduler drops the sequence at its next step.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

import numpy as np

from servekit.codecs import v2_grpc as codec
from servekit.codecs.infer_request import InferRequest
from servekit.dataplane import generation as gen
from servekit.dataplane.data_plane import DataPlane
from servekit.dataplane.repository import ModelVersion
from servekit.errors import ServekitError
from servekit.protocols import generate_requests as gr
from servekit.protocols.grpc.protos.inference import grpc_service_pb2 as pb
from servekit.streams import close

#: Triton's decoupled-model parameter: the client asks for an empty final response
EMPTY_FINAL = "triton_enable_empty_final_response"


def is_generate(request: pb.ModelInferRequest) -> bool:
    """Whether the request looks like a generate request (the model still decides)."""
    return any(tensor.name == gr.TEXT_INPUT and tensor.datatype == "BYTES" for tensor in request.inputs)


def may_generate(mv: ModelVersion) -> bool:
    """Whether the model may answer ``complete`` (a plugin may still decline, with ``None``).

    A model in a model host has its hooks there: only trying tells.
    """
    return mv.in_model_hosts or surely_generates(mv)


def surely_generates(mv: ModelVersion) -> bool:
    """Whether a plugin in this process has a ``complete`` hook for the model."""
    hooks = getattr(mv, "hooks", None)
    return hooks is not None and bool(hooks.complete.get_hookimpls())


class Generation:
    """One generate request over gRPC: its spec, and the responses that answer it."""

    def __init__(self, dp: DataPlane, mv: ModelVersion, request: pb.ModelInferRequest, decoded: InferRequest):
        self.dp, self.mv, self.request = dp, mv, request
        prompt, fields = gr.tensor_fields(decoded.inputs)
        self.parameters = {k: v for k, v in decoded.parameters.items() if k != EMPTY_FINAL}
        self.spec = gr.read(prompt, fields, self.parameters)

    def whole(self) -> pb.ModelInferResponse:
        choice = gr.whole(self.dp, self.mv, self.spec, self.parameters)
        return self.response(gr.answer_text(self.spec, choice), gr.whole_extras(self.spec, choice))

    def pieces(self) -> Generator[gen.StreamEvent, None, None]:
        """Start generating; raises here (before any response) when the model refuses."""
        return gr.stream(self.dp, self.mv, self.spec, self.parameters)

    def stream(self, events: Generator[gen.StreamEvent, None, None], context: Any) -> Iterator[pb.ModelInferResponse]:
        """One response per piece with text; a last one with the finish reason when asked for."""
        try:
            for item in events:
                if isinstance(item, gen.StreamPiece):
                    if not context.is_active():
                        return  # cancelled: finally closes the model's generator
                    if item.chunk.text:
                        yield self.response(item.chunk.text, gr.extras(self.spec, item.choice, item.chunk, final=False))
                elif isinstance(item, gen.ChoiceEnded) and self.spec.extras:
                    closing = item.choice.closing
                    yield self.response("", gr.extras(self.spec, item.choice, closing, final=True))
        except ServekitError:
            raise
        except Exception as exc:  # raised while reading the model's generator
            raise gen.model_failure(self.mv.name, exc) from exc
        finally:
            close(events)

    def response(self, text: str, extras: dict[str, Any]) -> pb.ModelInferResponse:
        response = pb.ModelInferResponse(
            model_name=self.request.model_name, model_version=str(self.mv.version), id=self.request.id
        )
        outputs = {gr.TEXT_OUTPUT: _bytes(text)}
        for name, value in extras.items():
            outputs[name] = _bytes(value or "") if name == "finish_reason" else np.array([value], dtype=np.uint32)
        codec.encode_outputs(response, outputs, typed=codec.used_typed_contents(self.request))
        return response


def _bytes(text: str) -> np.ndarray:
    out = np.empty(1, dtype=object)
    out[0] = text.encode("utf-8")
    return out


class Interleave:
    """One ``ModelStreamInfer`` call: ordinary requests answered in order on the call's thread,
    generate requests each on a thread of its own, every response sent as it comes.

    A reader thread takes the client's requests as they arrive, so a generate
    request does not wait for the one before it to finish.
    """

    #: how often a waiting call looks whether it was cancelled
    POLL_S = 1.0

    def __init__(self, context: Any):
        self.context = context
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()

    def run(
        self,
        requests: Iterable[Any],
        answer: Callable[[Any], Iterator[Any]],
        concurrent: Callable[[Any], bool],
    ) -> Iterator[Any]:
        threading.Thread(target=self._read, args=(requests,), name="servekit-grpc-stream-reader", daemon=True).start()
        running, ended = 0, False
        while not (ended and running == 0):
            try:
                kind, value = self.events.get(timeout=self.POLL_S)
            except queue.Empty:
                kind, value = "idle", None
            if kind == "request" and concurrent(value):
                running += 1
                run = contextvars.copy_context().run  # the call's tracing context goes along
                threading.Thread(target=run, args=(self._produce, answer, value), daemon=True).start()
            elif kind == "request":
                yield from answer(value)
            elif kind == "response":
                yield value
            elif kind == "done":
                running -= 1
            elif kind == "end":
                ended = True
            elif kind == "failed":
                raise value
            if not self.context.is_active():
                return  # cancelled: the generations stop at their next piece

    def _read(self, requests: Iterable[Any]) -> None:
        try:
            for request in requests:
                self.events.put(("request", request))
        except Exception:  # the call was cancelled or broke: nothing more will come
            pass
        self.events.put(("end", None))

    def _produce(self, answer: Callable[[Any], Iterator[Any]], request: Any) -> None:
        try:
            for response in answer(request):
                self.events.put(("response", response))
        except Exception as exc:  # not a ServekitError (those are responses): the call fails
            self.events.put(("failed", exc))
        finally:
            self.events.put(("done", None))
