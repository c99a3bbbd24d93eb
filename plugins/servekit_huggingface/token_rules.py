"""Per-request token rules: OpenAI's ``logit_bias`` and vLLM's ``allowed_token_ids``,
``min_tokens`` and ``stop_token_ids``, and the scoring of a prompt's tokens.

The protocol checks the fields' shapes and hands them in ``request.options``
(``logit_bias`` keyed by integer ids); the ids are checked here against the
model's vocabulary (a 400 naming the field).  :class:`TokenRules` changes one
row's logits before its token is chosen, in vLLM's order: the allowed ids
first, then the biases (added to the raw logits, as OpenAI and vLLM add them),
then the end-of-text and stop ids masked while fewer than ``min_tokens`` tokens
were generated.  Log-probabilities stay those of the raw logits (vLLM's
default ``raw_logprobs``).  A stop token id ends the sequence; its text is
not part of the answer (as vLLM leaves it out), though it counts as a
generated token.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from servekit.errors import BadRequest

#: the option keys these rules read (the protocol's names)
RULE_OPTIONS = ("logit_bias", "allowed_token_ids", "min_tokens", "stop_token_ids")

#: a prompt token's score: its id, its log-probability, its rank (1: the most likely), and its
#: position's most likely ids and their log-probabilities
PromptScore = tuple[int, float, int, list[int], list[float]]


def _checked_ids(ids: Iterable[int], vocabulary: int, key: str) -> list[int]:
    ids = list(ids)
    bad = next((t for t in ids if not 0 <= t < vocabulary), None)
    if bad is not None:
        raise BadRequest(f"'{key}': token id {bad} is outside the model's vocabulary (0..{vocabulary - 1})", param=key)
    return ids


class TokenRules:
    """One request's rules, applied to one row's logits (1-D) given the tokens generated so far."""

    def __init__(self, options: dict[str, Any], vocabulary: int, eos_ids: Iterable[int]):
        bias = options.get("logit_bias") or {}
        self.bias_ids = _checked_ids(bias, vocabulary, "logit_bias")
        self.bias_values = [float(bias[t]) for t in self.bias_ids]
        allowed = options.get("allowed_token_ids")
        self.allowed = None if allowed is None else sorted(set(_checked_ids(allowed, vocabulary, "allowed_token_ids")))
        self.stop_ids = frozenset(_checked_ids(options.get("stop_token_ids") or [], vocabulary, "stop_token_ids"))
        self.min_tokens = int(options.get("min_tokens") or 0)
        self.ending = sorted(set(eos_ids) | self.stop_ids)
        self._tensors: dict[Any, tuple[torch.Tensor, ...]] = {}

    @classmethod
    def of(cls, options: dict[str, Any], vocabulary: int, eos_ids: Iterable[int]) -> TokenRules | None:
        """The request's rules, or ``None`` when it sets none."""
        if not any(options.get(key) for key in RULE_OPTIONS):
            return None
        return cls(options, vocabulary, eos_ids)

    @property
    def changes_logits(self) -> bool:
        return bool(self.bias_ids or self.allowed is not None or (self.min_tokens and self.ending))

    def __call__(self, logits: torch.Tensor, tokens: list[int]) -> torch.Tensor:
        if not self.changes_logits:
            return logits
        allowed, bias_ids, bias_values, ending = self._on(logits.device)
        out = logits.float().clone()
        if self.allowed is not None:
            masked = torch.full_like(out, float("-inf"))
            masked[..., allowed] = out[..., allowed]
            out = masked
        if self.bias_ids:
            out[..., bias_ids] += bias_values
        if len(tokens) < self.min_tokens and self.ending:
            out[..., ending] = float("-inf")
        return out

    def _on(self, device: Any) -> tuple[torch.Tensor, ...]:
        """The rules' ids and biases as tensors on ``device`` (made once)."""
        made = self._tensors.get(device)
        if made is None:
            made = self._tensors[device] = (
                torch.tensor(self.allowed or [], dtype=torch.long, device=device),
                torch.tensor(self.bias_ids, dtype=torch.long, device=device),
                torch.tensor(self.bias_values, dtype=torch.float32, device=device),
                torch.tensor(self.ending, dtype=torch.long, device=device),
            )
        return made


def score_prompt(logits: torch.Tensor, ids: list[int], top: int) -> list[PromptScore]:
    """Each prompt token's score after the first, from the prefill's logits of one row (``[length, vocab]``:
    position ``j`` predicts token ``j + 1``), the raw log-softmax as generated tokens are scored."""
    if len(ids) < 2:
        return []
    logprobs = torch.log_softmax(logits[: len(ids) - 1].float(), dim=-1)
    targets = torch.tensor(ids[1:], device=logprobs.device).unsqueeze(-1)
    chosen = logprobs.gather(-1, targets)
    ranks = (logprobs > chosen).sum(dim=-1) + 1
    top = min(top, logprobs.shape[-1])
    if top:
        values, order = logprobs.topk(top, dim=-1)
        top_values, top_ids = values.tolist(), order.tolist()
    else:
        top_values = top_ids = [[] for _ in ids[1:]]
    return [
        (token, value, rank, top_ids[j], top_values[j])
        for j, (token, value, rank) in enumerate(zip(ids[1:], chosen.squeeze(-1).tolist(), ranks.tolist()))
    ]
