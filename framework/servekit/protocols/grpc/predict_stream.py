"""The request states of ``PredictionService/PredictStreamed`` (``PredictStreamedOptions``).

A stream is a sequence of logical requests ("turns").  ``NONE`` is a whole turn
on its own.  ``SPLIT`` holds a piece; ``END_SPLIT`` adds the last piece and
starts the turn: the pieces' tensors are concatenated along the dimension
``split_dimensions`` gives for each input, and an input not in that map is taken
from the turn's first piece.  ``CANCEL`` ends the stream at once, dropping held
pieces.  Refused with ``INVALID_ARGUMENT``: ``NONE`` mixed with ``SPLIT`` /
``END_SPLIT`` in one stream, a stream ending with pieces held, pieces of one
turn addressing different models or signatures, and a stream changing
``return_single_response``.

This module holds only the state machine; :mod:`.tf_serving` runs the turns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from servekit.errors import BadRequest
from servekit.protocols.grpc.protos.tensorflow_serving.apis import predict_pb2

_States = predict_pb2.PredictStreamedOptions.RequestState


@dataclass
class Turn:
    """One logical Predict: what the data plane runs."""

    model_spec: Any
    inputs: dict[str, np.ndarray]
    output_filter: list[str] | None


class PredictStream:
    """The state of one ``PredictStreamed`` call; feed it each request in order."""

    NONE = _States.Value("NONE")
    SPLIT = _States.Value("SPLIT")
    END_SPLIT = _States.Value("END_SPLIT")
    CANCEL = _States.Value("CANCEL")

    def __init__(
        self,
        decode_inputs: Callable[[Any], dict[str, np.ndarray]],
        output_filter: Callable[[Any], list[str] | None],
    ):
        self._decode = decode_inputs
        self._output_filter = output_filter
        self._pieces: list[Any] = []
        self._mode: str | None = None  # "none" or "split", fixed by the first request
        self._single: bool | None = None
        self.cancelled = False
        self.count = 0

    @property
    def single_response(self) -> bool:
        return bool(self._single)

    def feed(self, request: Any) -> Turn | None:
        """Take the next request; returns the turn to run now, if this request completes one."""
        self.count += 1
        options = request.predict_streamed_options
        state = options.request_state
        if state == self.CANCEL:
            self.cancelled = True
            self._pieces.clear()
            return None
        self._check_single(options.return_single_response)
        if state == self.NONE:
            self._enter("none", "NONE")
            return Turn(request.model_spec, self._decode(request), self._output_filter(request))
        if state not in (self.SPLIT, self.END_SPLIT):
            raise BadRequest(f"request {self.count}: unknown request_state {state}")
        self._enter("split", _States.Name(state))
        if self._pieces:
            self._check_same_target(request)
        self._pieces.append(request)
        if state == self.SPLIT:
            return None
        pieces, self._pieces = self._pieces, []
        return self._join(pieces)

    def finish(self) -> None:
        """The client closed its side: refuse a turn that never got its END_SPLIT."""
        if self._pieces and not self.cancelled:
            raise BadRequest(
                f"the stream ended with {len(self._pieces)} SPLIT request(s) and no END_SPLIT; "
                "send END_SPLIT as the last piece of each request"
            )

    # -- checks ---------------------------------------------------------------------

    def _enter(self, mode: str, state_name: str) -> None:
        if self._mode is None:
            self._mode = mode
        elif self._mode != mode:
            other = "NONE" if self._mode == "none" else "SPLIT/END_SPLIT"
            raise BadRequest(
                f"request {self.count}: request_state {state_name} after {other} in the same stream; "
                "NONE cannot be mixed with SPLIT and END_SPLIT"
            )

    def _check_single(self, single: bool) -> None:
        if self._single is None:
            self._single = single
        elif self._single != single:
            raise BadRequest(
                f"request {self.count}: return_single_response changed within the stream; "
                "it must be the same for every request"
            )

    def _check_same_target(self, request: Any) -> None:
        first = self._pieces[0].model_spec
        # a later piece may leave model_spec out; if it names one, it must be the same
        if request.HasField("model_spec") and request.model_spec != first:
            raise BadRequest(
                f"request {self.count}: every piece of a split request must have the same model_spec "
                f"(the first piece names {first.name!r}, signature {first.signature_name!r})"
            )
        first_filter = list(self._pieces[0].output_filter)
        if request.output_filter and list(request.output_filter) != first_filter:
            raise BadRequest(f"request {self.count}: output_filter differs from the first piece's")

    # -- joining --------------------------------------------------------------------

    def _join(self, pieces: list[Any]) -> Turn:
        dims = self._split_dimensions(pieces)
        decoded = [self._decode_piece(p, i) for i, p in enumerate(pieces)]
        first = decoded[0]
        names = list(first) + [n for d in decoded[1:] for n in d if n not in first and n not in dims]
        inputs: dict[str, np.ndarray] = {}
        for name in dict.fromkeys(names):
            if name not in dims:
                if name not in first:
                    raise BadRequest(
                        f"input {name!r} is not in split_dimensions and missing from the first piece, "
                        "which supplies every input that is not split"
                    )
                inputs[name] = first[name]
        for name, dim in dims.items():
            inputs[name] = _concatenate(name, dim, [d.get(name) for d in decoded])
        return Turn(pieces[0].model_spec, inputs, self._output_filter(pieces[0]))

    def _decode_piece(self, piece: Any, index: int) -> dict[str, np.ndarray]:
        try:
            return self._decode(piece)
        except BadRequest as exc:
            raise BadRequest(f"piece {index + 1} of the split request: {exc.message}") from None

    @staticmethod
    def _split_dimensions(pieces: list[Any]) -> dict[str, int]:
        """The pieces' split_dimensions, merged; two pieces may not disagree."""
        dims: dict[str, int] = {}
        for piece in pieces:
            for name, dim in piece.predict_streamed_options.split_dimensions.items():
                if dims.setdefault(name, dim) != dim:
                    raise BadRequest(
                        f"split_dimensions of input {name!r} differ between pieces ({dims[name]} and {dim})"
                    )
        return dims


def _concatenate(name: str, dim: int, parts: list[np.ndarray | None]) -> np.ndarray:
    missing = [i + 1 for i, p in enumerate(parts) if p is None]
    if missing:
        raise BadRequest(f"split input {name!r} is missing from piece(s) {', '.join(map(str, missing))}")
    arrays = [p for p in parts if p is not None]
    rank = arrays[0].ndim
    if dim < 0 or dim >= rank:
        raise BadRequest(f"split dimension {dim} of input {name!r} is outside its rank {rank}")
    if len({a.dtype for a in arrays}) > 1:
        raise BadRequest(
            f"the pieces of input {name!r} have different dtypes: {', '.join(str(a.dtype) for a in arrays)}"
        )
    try:
        return np.concatenate(arrays, axis=dim)
    except ValueError:
        shapes = ", ".join(str(list(a.shape)) for a in arrays)
        raise BadRequest(
            f"cannot concatenate the pieces of input {name!r} along dimension {dim}: shapes {shapes} "
            "must agree everywhere else"
        ) from None
