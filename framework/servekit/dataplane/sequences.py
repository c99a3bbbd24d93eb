"""Triton's sequence batching for stateful models: a state per sequence, its requests in order.

A model whose ``servekit.yaml`` says ``sequence:`` (or whose Triton load config
has ``sequence_batching``) keeps a state per sequence.  A request names its
sequence with the request parameters ``sequence_id`` (a non-zero integer or a
non-empty string; HTTP ``parameters``, gRPC's ``int64_param``/``string_param``),
``sequence_start`` (true on its first request) and ``sequence_end`` (true on
its last).  The model's ``predict`` hook takes the argument ``sequence``: a
:class:`Sequence` whose ``state`` dict it keeps between the sequence's requests
(``None`` for a request outside any sequence)::

    @servekit.hookimpl
    def predict(inputs, sequence):
        if sequence.start:
            sequence.state["total"] = 0
        sequence.state["total"] += int(inputs["INPUT"].sum())
        return {"OUTPUT": np.array([[sequence.state["total"]]], dtype=np.int32)}

The requests of one sequence run one at a time, in the order they arrive, and
never share a batch.  A sequence that sees no request for ``max_idle_ms``
(Triton's ``max_sequence_idle_microseconds``, 1 s by default as there) is
dropped: its next request without ``sequence_start`` is refused, as is any
request of a sequence never started.

A Triton folder whose ``config.pbtxt`` has ``sequence_batching`` is a sequence
model too, as Triton's sequence batcher runs it
(:func:`servekit.folders.triton_config.sequence`): every request must name its
sequence (``require_sequence_id``; a request without is refused with Triton's
400), and each ``control_input`` it declares is fed to ``predict`` as a tensor
beside the request's (:meth:`Sequences.with_controls`): START is true on a
sequence's first request, END on its last, READY on every request (each call
carries one), CORRID holds the sequence id.  Triton's ``direct`` and ``oldest``
strategies only choose how sequences share batches; servekit runs each
sequence's requests alone, so the answers are the same.

Where the state lives: a sequence model runs in one model host (``placement:
process``, one replica) that every worker hands its requests to, so a
sequence's requests find their state whichever worker they reach.
``placement: worker`` keeps a state per worker instead (right with one worker).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servekit.errors import BadRequest

#: Triton's default max_sequence_idle_microseconds, in milliseconds.
DEFAULT_IDLE_MS = 1000.0
PARAMETERS = ("sequence_id", "sequence_start", "sequence_end")


@dataclass
class Sequence:
    """One sequence, as the ``predict`` hook's ``sequence`` argument sees it."""

    id: int | str
    #: this request starts the sequence (its state is fresh and empty)
    start: bool = False
    #: this request ends it (its state is dropped after the answer)
    end: bool = False
    #: what the model keeps between the sequence's requests
    state: dict[str, Any] = field(default_factory=dict)
    last_used: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


def sequence_parameters(parameters: dict[str, Any]) -> tuple[int | str, bool, bool] | None:
    """The request's sequence parameters, checked; ``None`` outside a sequence."""
    seq_id = parameters.get("sequence_id")
    start, end = parameters.get("sequence_start", False), parameters.get("sequence_end", False)
    for key, flag in (("sequence_start", start), ("sequence_end", end)):
        if not isinstance(flag, bool):
            raise BadRequest(f"parameter {key!r} must be true or false, found {flag!r}")
    if seq_id in (None, 0, ""):
        if start or end:
            raise BadRequest("'sequence_start' and 'sequence_end' need a 'sequence_id' parameter")
        return None
    if isinstance(seq_id, bool) or not isinstance(seq_id, (int, str)):
        raise BadRequest(f"parameter 'sequence_id' must be an integer or a string, found {seq_id!r}")
    return seq_id, start, end


class Sequences:
    """The live sequences of one model version."""

    def __init__(
        self,
        model: str,
        max_idle_ms: float = DEFAULT_IDLE_MS,
        *,
        require_sequence_id: bool = False,
        controls: list[dict[str, Any]] | None = None,
    ):
        self.model = model
        self.max_idle = max_idle_ms / 1000.0
        self.require_sequence_id = require_sequence_id
        self.controls = list(controls or [])
        self._live: dict[int | str, Sequence] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._live)

    def open(self, parameters: dict[str, Any]) -> Sequence | None:
        """The request's sequence (a fresh one on ``sequence_start``), or ``None`` outside one."""
        found = sequence_parameters(parameters)
        if found is None:
            if self.require_sequence_id:  # Triton's sequence batcher runs no request outside a sequence
                raise BadRequest(
                    f"inference request to model '{self.model}' must specify a non-zero or non-empty correlation ID"
                )
            return None
        seq_id, start, end = found
        now = time.monotonic()
        with self._lock:
            self._drop_idle(now)
            sequence = self._live.get(seq_id)
            if start:
                sequence = self._live[seq_id] = Sequence(seq_id)
            elif sequence is None:
                raise BadRequest(
                    f"inference request for sequence {seq_id} to model '{self.model}' must specify the "
                    "START flag on the first request of the sequence (or the sequence was idle longer "
                    f"than {self.max_idle * 1000:g} ms)"
                )
            sequence.last_used = now
        sequence.lock.acquire()  # the sequence's requests run one at a time
        sequence.start, sequence.end = start, end
        return sequence

    def close(self, sequence: Sequence) -> None:
        """After the request: the sequence waits for its next one, or ends."""
        with self._lock:
            sequence.last_used = time.monotonic()
            if sequence.end and self._live.get(sequence.id) is sequence:
                del self._live[sequence.id]
        sequence.lock.release()

    def with_controls(self, sequence: Sequence, inputs: Any) -> Any:
        """The request's inputs with the control tensors the model declares (Triton's ``control_input``)."""
        if not self.controls:
            return inputs
        if not isinstance(inputs, dict):
            raise BadRequest(f"model '{self.model}' takes named inputs (it is fed sequence control tensors)")
        taken = sorted(c["name"] for c in self.controls if c["name"] in inputs)
        if taken:
            raise BadRequest(f"input {taken[0]!r} of model '{self.model}' is a sequence control the server sets")
        return {**inputs, **{c["name"]: _control_tensor(c, sequence) for c in self.controls}}

    def _drop_idle(self, now: float) -> None:
        idle = [k for k, s in self._live.items() if now - s.last_used > self.max_idle and not s.lock.locked()]
        for key in idle:
            del self._live[key]


_NUMPY_TYPES = {"INT32": np.int32, "FP32": np.float32, "BOOL": np.bool_, "UINT64": np.uint64, "INT64": np.int64}
_NUMPY_TYPES["UINT32"] = np.uint32


def _control_tensor(control: dict[str, Any], sequence: Sequence) -> np.ndarray:
    """One control tensor for a request of ``sequence``: its false or true value, or the sequence id."""
    shape = control["shape"]
    if control["kind"] == "corrid":
        if control["datatype"] == "BYTES":
            return np.full(shape, str(sequence.id).encode("utf-8"), dtype=object)
        if isinstance(sequence.id, str) and not sequence.id.isdigit():
            raise BadRequest(
                f"sequence id {sequence.id!r} is a string, but control input '{control['name']}' "
                f"holds a {control['datatype']} correlation ID"
            )
        return np.full(shape, int(sequence.id), dtype=_NUMPY_TYPES[control["datatype"]])
    on = {"start": sequence.start, "end": sequence.end, "ready": True}[control["kind"]]
    return np.full(shape, control["values"][1 if on else 0], dtype=_NUMPY_TYPES[control["datatype"]])


def sequences_of(mv: Any) -> Sequences | None:
    """The version's sequences, when its model keeps sequence state."""
    config = getattr(mv.config, "sequence", None)
    if config is None:
        return None
    found = mv.__dict__.get("_sequences")
    if found is None:
        live = Sequences(
            mv.name,
            config.max_idle_ms,
            require_sequence_id=getattr(config, "require_sequence_id", False),
            controls=getattr(config, "controls", None),
        )
        found = mv.__dict__.setdefault("_sequences", live)
    return found
