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

A cancelled call (the client's ``stop_stream(cancel_requests=True)``, a
deadline, a dropped connection) ends the loop at the next piece: the model's
generator is closed and the scheduler drops the sequence at its next step.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

import numpy as np

from ... import generation as gen
from ...codecs import v2_grpc as codec
from ...dataplane import DataPlane
from ...errors import ModelFailure, ServekitError
from ...inference import InferRequest
from ...repository import ModelVersion
from ...streams import close
from .. import generate_requests as gr
from .protos.inference import grpc_service_pb2 as pb

#: Triton's decoupled-model parameter: the client asks for an empty final response
EMPTY_FINAL = "triton_enable_empty_final_response"


def is_generate(request: pb.ModelInferRequest) -> bool:
    """Whether the request looks like a generate request (the model still decides)."""
    return any(tensor.name == gr.TEXT_INPUT and tensor.datatype == "BYTES" for tensor in request.inputs)


def may_generate(mv: ModelVersion) -> bool:
    """Whether the model may answer ``complete`` (a plugin may still decline, with ``None``).

    A model in a model host has its hooks there: only trying tells.
    """
    return getattr(mv, "host", None) is not None or surely_generates(mv)


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

    def pieces(self) -> Generator[gen.GenerationChunk, None, None]:
        """Start generating; raises here (before any response) when the model refuses."""
        return gr.pieces(self.dp, self.mv, self.spec, self.parameters)

    def stream(
        self, pieces: Generator[gen.GenerationChunk, None, None], context: Any
    ) -> Iterator[pb.ModelInferResponse]:
        """One response per piece with text; a last one with the finish reason when asked for."""
        tally = gr.Tally(self.spec, self.dp.tokenizer(self.mv))
        last = gen.GenerationChunk()
        try:
            for chunk in pieces:
                if not context.is_active():
                    return  # cancelled: finally closes the model's generator
                last = chunk
                if chunk.text:
                    yield self.response(chunk.text, tally.extras(chunk, final=False))
            if self.spec.extras:
                closing = gen.GenerationChunk("", last.finish_reason, last.prompt_tokens, last.completion_tokens)
                yield self.response("", tally.extras(closing, final=True))
        except ServekitError:
            raise
        except Exception as exc:  # raised while iterating the model's generator
            raise ModelFailure(f"model {self.mv.name!r} failed in complete: {type(exc).__name__}: {exc}") from exc
        finally:
            close(pieces)

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
