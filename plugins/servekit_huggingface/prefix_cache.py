"""Automatic prefix caching: prompts that start the same way share the keys and values of that start.

As vLLM does by default, a prompt is cut into blocks of :data:`BLOCK` tokens,
and each full block is named by a hash of every token up to its end (its
parent's hash and its own tokens), so a name stands for the whole prefix, not
for the block's tokens wherever they appear.  After a prefill, the keys and
values of the prompt's full blocks are kept, one copy per name.  A joining
prompt whose first blocks are kept starts from their keys and values, and the
forward pass computes only the tokens after them (at least the last one: its
logits give the first new token).  Sixteen chats with one system prompt, or one
prompt asked sixteen times, compute the shared part once.

The keys and values of a position depend only on the tokens up to it (causal
attention), so a row that starts from kept blocks attends to the same numbers
it would compute itself, up to the rounding of a differently shaped product.
Only the prompt's blocks are kept, not the generated tokens'.  The blocks live
on the model's device and count against ``options.prefix_cache_mb`` (default
:data:`DEFAULT_MB`); beyond it the least recently used go first.  One scheduler
thread uses the cache, so it takes no lock.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from typing import Any

import torch

#: tokens per block (vLLM's default block size)
BLOCK = 16
#: the cache's default budget on the model's device
DEFAULT_MB = 256

#: one block: the keys and the values of every layer, each ``[1, heads, BLOCK, head_dim]``
Block = list[tuple[torch.Tensor, torch.Tensor]]


def block_names(ids: list[int]) -> list[bytes]:
    """The names of the prompt's full blocks: each a hash of every token up to the block's end."""
    names: list[bytes] = []
    parent = b""
    for start in range(0, len(ids) - BLOCK + 1, BLOCK):
        parent = hashlib.sha256(parent + array("q", ids[start : start + BLOCK]).tobytes()).digest()
        names.append(parent)
    return names


class PrefixCache:
    """Kept blocks by name, least recently used first, within a byte budget."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.blocks: OrderedDict[bytes, tuple[Block, int]] = OrderedDict()
        self.bytes = 0
        #: prompt tokens looked up, and how many of them came from kept blocks (for tests and /metrics)
        self.queried = 0
        self.hit = 0

    def __len__(self) -> int:
        return len(self.blocks)

    def held(self, ids: list[int], names: list[bytes]) -> int:
        """How many of the prompt's first tokens kept blocks hold, leaving at least the last one to compute
        (a look only: nothing is counted or moved)."""
        found = 0
        for name in names:
            if name not in self.blocks:
                break
            found += BLOCK
        return min(found, len(ids) - 1)

    def cached(self, ids: list[int], names: list[bytes]) -> int:
        """:meth:`held`, counted as a lookup, its blocks the most recently used."""
        found = self.held(ids, names)
        for name in names[: -(-found // BLOCK)]:  # a block the last token cut short is used too
            self.blocks.move_to_end(name)
        self.queried += len(ids)
        self.hit += found
        return found

    def start(self, rows: list[list[bytes]], length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's keys and values for the first ``length`` tokens of each row, ``[rows, heads, length, d]``."""
        count = -(-length // BLOCK)
        per_row = [[self.blocks[name][0] for name in names[:count]] for names in rows]
        layers = len(per_row[0][0])
        out = []
        for layer in range(layers):
            keys = torch.cat([torch.cat([b[layer][0] for b in blocks], dim=-2) for blocks in per_row], dim=0)
            values = torch.cat([torch.cat([b[layer][1] for b in blocks], dim=-2) for blocks in per_row], dim=0)
            out.append((keys[:, :, :length], values[:, :, :length]))
        return out

    def keep(self, names: list[bytes], cache: Any, row: int) -> None:
        """Keep the full blocks of one prefilled row (``cache``: the prefill's, the row at ``row``)."""
        for i, name in enumerate(names):
            if name in self.blocks:
                self.blocks.move_to_end(name)
                continue
            part = slice(i * BLOCK, (i + 1) * BLOCK)
            block = [
                (layer.keys[row : row + 1, :, part].clone(), layer.values[row : row + 1, :, part].clone())
                for layer in cache.layers
            ]
            size = sum(k.nbytes + v.nbytes for k, v in block)
            if size > self.max_bytes:
                return
            self.blocks[name] = (block, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, dropped) = self.blocks.popitem(last=False)
                self.bytes -= dropped

    def clear(self) -> None:
        self.blocks.clear()
        self.bytes = 0
