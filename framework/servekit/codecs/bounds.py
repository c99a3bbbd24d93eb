"""How much one request may declare: elements per tensor, tensors per request.

A shape is a few bytes on the wire but names an allocation: ``[1000000000]``
with no data must be refused before anything is allocated, and a fill-style
TF Serving tensor (one value for the whole shape) must not become a huge array.
Every codec counts a tensor's elements through :func:`element_count` and a
request's inputs through :func:`check_input_count`, so one pair of limits holds
for V2 and TF Serving, over JSON and gRPC.

The limits are per process, set once from the settings when the app (or the
gRPC server) is built (:func:`configure`); tests and library use get the defaults.
"""

from __future__ import annotations

import math

from servekit.errors import PayloadTooLarge

_DEFAULT_ELEMENTS = 64 * 1024 * 1024  # the default --max-request-size: one byte per element at least
_DEFAULT_INPUTS = 1024

max_elements = _DEFAULT_ELEMENTS
max_inputs = _DEFAULT_INPUTS


def configure(*, max_tensor_elements: int, max_request_size: int, max_request_inputs: int) -> None:
    """``--max-tensor-elements`` (0: ``--max-request-size``) and ``--max-request-inputs``."""
    global max_elements, max_inputs
    max_elements = max_tensor_elements if max_tensor_elements > 0 else max(1, max_request_size)
    max_inputs = max(1, max_request_inputs)


def element_count(shape: tuple[int, ...] | list[int], where: str = "tensor") -> int:
    """The elements ``shape`` holds; :class:`PayloadTooLarge` above ``--max-tensor-elements``."""
    count = math.prod(shape)
    if count > max_elements:
        raise PayloadTooLarge(
            f"{where}: shape {list(shape)} holds {count} elements; the limit is {max_elements} (--max-tensor-elements)"
        )
    return count


def limited_inputs(inputs: list) -> list:
    """``inputs`` itself, once :func:`check_input_count` let its length through."""
    check_input_count(len(inputs))
    return inputs


def check_input_count(count: int) -> None:
    """:class:`PayloadTooLarge` when a request holds more than ``--max-request-inputs`` tensors."""
    if count > max_inputs:
        raise PayloadTooLarge(f"the request holds {count} inputs; the limit is {max_inputs} (--max-request-inputs)")
