"""The running batch's key/value cache: Transformers' ``DynamicCache`` with room kept ahead.

``DynamicLayer.update`` concatenates each step's keys and values onto the
cache, which copies the whole cache of every layer at every step: for 64 rows
that copy, not the arithmetic, is most of a small model's decoding step on a
CPU.  :class:`RoomyLayer` keeps each layer's keys and values at the start of a
larger buffer and writes a step's into the room after them; when the room runs
out, or the scheduler replaced the tensors (a row joined or left: the scheduler
pads, concatenates and selects rows on ``layer.keys`` / ``layer.values`` as on
any dynamic layer), the layer moves into a new buffer with as much room again
as it holds.  The keys and values the model attends to are the same numbers
either way.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

#: room a new buffer keeps ahead of what it holds, at least (positions)
MIN_ROOM = 64


class RoomyLayer(DynamicLayer):
    """A dynamic cache layer that writes each step into room kept ahead instead of concatenating."""

    keys: torch.Tensor | None
    values: torch.Tensor | None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.room: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        current, current_values = self.keys, self.values
        assert current is not None and current_values is not None
        held = current.shape[-2] if current.numel() else 0
        need = held + key_states.shape[-2]
        if not self._fits(current, key_states, need):
            self._move(current, current_values, key_states, value_states, held, need)
        assert self.room is not None
        keys, values = self.room
        keys[:, :, held:need] = key_states
        values[:, :, held:need] = value_states
        self.keys, self.values = keys[:, :, :need], values[:, :, :need]
        return self.keys, self.values

    def _fits(self, current: torch.Tensor, key_states: torch.Tensor, need: int) -> bool:
        """Whether the current keys still start the buffer (nobody replaced them) and it has room."""
        if self.room is None or not current.numel():
            return False
        keys = self.room[0]
        return (
            current.data_ptr() == keys.data_ptr()
            and current.shape[:2] == key_states.shape[:2] == keys.shape[:2]
            and current.stride() == keys.stride()
            and need <= keys.shape[-2]
        )

    def _move(
        self,
        current: torch.Tensor,
        current_values: torch.Tensor,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        held: int,
        need: int,
    ) -> None:
        rows, heads, _, _ = key_states.shape
        size = need + max(need, MIN_ROOM)
        keys = key_states.new_empty((rows, heads, size, key_states.shape[-1]))
        values = value_states.new_empty((rows, heads, size, value_states.shape[-1]))
        if held:
            keys[:, :, :held] = current
            values[:, :, :held] = current_values
        self.room = (keys, values)


def roomy_cache() -> Any:
    """An empty ``DynamicCache`` whose layers are :class:`RoomyLayer` (created as the model fills it)."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = RoomyLayer
    return cache
