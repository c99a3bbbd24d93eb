"""Constrained decoding: a row's tokens kept inside a grammar (structured outputs, forced tool calls).

A request's :class:`servekit.types.Constraint` (a JSON schema, any JSON object, a
regular expression, a choice of strings or an EBNF grammar) is compiled by
xgrammar against the model's tokenizer once and kept (:class:`Grammars`: by
constraint, per loaded model, so per tokenizer); each sequence gets its own
matcher.  At every step the scheduler asks the row's chooser for a token
(:class:`ConstrainedChooser`): it fills the row's allowed-token bitmask, masks
the row's logits (every other token to -inf), lets the row's own sampling choose
among what is left, and advances the matcher.  Only constrained rows pay for it,
so constrained and free rows share each step.  When the grammar is complete
only the end-of-text token is allowed, so the sequence ends with ``stop``.

xgrammar was chosen over llguidance by measurement (docs/structured-outputs.md,
``bench/grammar_engines.py``): it compiles a schema ahead of the first token
(so the compiled grammar can be cached and no step stalls on it), where
llguidance builds its lexer lazily inside a token's mask (seconds, once, in the
middle of a batch step, with a small vocabulary).
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from servekit.errors import BadRequest
from servekit.types import Constraint

#: compiled grammars kept per model (least recently used dropped first)
CACHE_SIZE = 256


class Grammars:
    """One model's tokenizer as xgrammar sees it, and its compiled grammars by constraint."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: set[int]):
        import xgrammar as xgr

        self.xgr = xgr
        self.vocab_size = vocab_size
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(eos_ids) or None
        )
        # xgrammar's JSON strings admit raw control characters, which JSON does not (RFC 8259), and
        # UTF-8 surrogates, which no decoder reads: JSON rows never get a token holding a control
        # character or bytes that are no UTF-8 (escapes such as \\n are backslash and letter), and
        # after a token that ends inside a character only the tokens that go on with it validly
        self.raw: list[bytes] = list(info.decoded_vocab)
        #: the tokens a JSON text may hold, as a bitmask in xgrammar's layout (ANDed into the grammar's)
        self.json_tokens = _packed(
            [not (any(b < 0x20 for b in raw) or not _utf8_prefix(b"", raw)) for raw in self.raw], vocab_size
        )
        # after a character's first bytes: the tokens that go on with it validly, by what the
        # character still needs (seven kinds of state in all; only tokens opening with a
        # continuation byte can, so only those are looked at)
        continuing = [(i, raw) for i, raw in enumerate(self.raw[:vocab_size]) if raw and 0x80 <= raw[0] <= 0xBF]
        self.after: dict[tuple[int, int, int], torch.Tensor] = {}
        for state in _OPEN_STATES:
            allowed = [False] * vocab_size
            for i, raw in continuing:
                allowed[i] = _goes_on(state, raw)
            self.after[state] = _packed(allowed, vocab_size)
        self.compiler = xgr.GrammarCompiler(info, cache_enabled=False)  # our own cache, bounded by count
        self.compiled: OrderedDict[str, Any] = OrderedDict()
        self.lock = threading.Lock()
        self.compiles = 0  # grammars compiled (the cache's misses), for tests and the bench

    def matcher(self, constraint: Constraint) -> Any:
        """A fresh matcher for one sequence (its grammar compiled once per constraint)."""
        return self.xgr.GrammarMatcher(self.grammar(constraint))

    def grammar(self, constraint: Constraint) -> Any:
        key = json.dumps([constraint.kind, constraint.value], sort_keys=True)
        with self.lock:
            found = self.compiled.get(key)
            if found is not None:
                self.compiled.move_to_end(key)
                return found
        compiled = self._compile(constraint)
        with self.lock:
            self.compiles += 1
            self.compiled[key] = compiled
            while len(self.compiled) > CACHE_SIZE:
                self.compiled.popitem(last=False)
        return compiled

    def going_on_from(self, tail: bytes) -> torch.Tensor:
        """The tokens that keep ``tail`` (a character's first bytes) UTF-8, as a bitmask."""
        return self.after[_open_state(tail)]

    def _compile(self, constraint: Constraint) -> Any:
        kind, value = constraint.kind, constraint.value
        try:
            if kind == "json_schema":
                return self.compiler.compile_json_schema(json.dumps(value), any_whitespace=False, strict_mode=True)
            if kind == "json_object":  # an object, as OpenAI's JSON mode answers
                return self.compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if kind == "regex":
                return self.compiler.compile_regex(value)
            if kind == "choice":
                # a regular expression of the choices, each matched literally
                return self.compiler.compile_regex("|".join(_literal(c) for c in value))
            if kind == "grammar":
                return self.compiler.compile_grammar(value)
        except Exception as exc:  # xgrammar's errors say what in the schema or grammar it cannot read
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            message = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", message)  # the engine's time and source line
            raise BadRequest(
                f"'{constraint.param}' cannot be compiled to a grammar: {message}", param=constraint.param
            ) from None
        raise BadRequest(f"'{constraint.param}': unknown constraint kind {kind!r}", param=constraint.param)


class ConstrainedChooser:
    """A row's chooser under a grammar: its logits masked to the tokens the grammar allows, then the
    row's own chooser (penalty, sampling) picks, and the matcher takes the token."""

    def __init__(
        self,
        grammars: Grammars,
        constraint: Constraint,
        choose: Callable[[torch.Tensor, list[int]], int],
    ):
        self.xgr = grammars.xgr
        self.matcher = grammars.matcher(constraint)
        self.grammars = grammars
        self.json_text = constraint.kind in ("json_schema", "json_object")
        self.tail = b""  # the last token's bytes of a character not complete yet
        self.choose = choose
        self.vocab_size = grammars.vocab_size
        self.bitmask = self.xgr.allocate_token_bitmask(1, grammars.vocab_size)

    def __call__(self, logits: torch.Tensor, tokens: list[int]) -> int:
        self.matcher.fill_next_token_bitmask(self.bitmask)
        if self.json_text:
            grammars = self.grammars
            self.bitmask &= grammars.json_tokens if not self.tail else grammars.going_on_from(self.tail)
        # the row's own logits, masked in place (each row's are its own; their scores were taken before)
        masked = logits.float().unsqueeze(0)
        self.xgr.apply_token_bitmask_inplace(masked, self.bitmask.to(masked.device), vocab_size=self.vocab_size)
        token = self.choose(masked[0], tokens)
        if not self.matcher.accept_token(token):
            raise RuntimeError(f"the grammar refused token {token} its own mask allowed")
        if self.json_text and token < len(self.grammars.raw):
            self.tail = _incomplete_end(self.tail + self.grammars.raw[token])
        return token


#: a UTF-8 lead byte's continuation bytes: how many, and the range the first one must be in
#: (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF)
def _lead(b: int) -> tuple[int, int, int] | None:
    if 0xC2 <= b <= 0xDF:
        return 1, 0x80, 0xBF
    if b == 0xE0:
        return 2, 0xA0, 0xBF
    if b == 0xED:
        return 2, 0x80, 0x9F
    if 0xE1 <= b <= 0xEF:
        return 2, 0x80, 0xBF
    if b == 0xF0:
        return 3, 0x90, 0xBF
    if 0xF1 <= b <= 0xF3:
        return 3, 0x80, 0xBF
    if b == 0xF4:
        return 3, 0x80, 0x8F
    return None


def _utf8_walk(data: bytes) -> int | None:
    """Where the incomplete character at the end of ``data`` starts (``len(data)`` when none);
    ``None`` when ``data`` is not UTF-8 nor the start of it."""
    i, n = 0, len(data)
    while i < n:
        b = data[i]
        if b < 0x80:
            i += 1
            continue
        lead = _lead(b)
        if lead is None:
            return None
        need, lo, hi = lead
        for k in range(1, need + 1):
            if i + k >= n:
                return i
            c = data[i + k]
            if not (lo <= c <= hi if k == 1 else 0x80 <= c <= 0xBF):
                return None
        i += need + 1
    return n


def _packed(allowed: list[bool], vocab_size: int) -> torch.Tensor:
    """Token flags as a ``[1, words]`` int32 bitmask, bit ``i % 32`` of word ``i // 32`` (xgrammar's layout)."""
    import numpy as np

    flags = np.zeros(((vocab_size + 31) // 32) * 32, dtype=bool)
    flags[: min(len(allowed), vocab_size)] = allowed[:vocab_size]
    return torch.from_numpy(np.packbits(flags, bitorder="little").view("<i4").astype(np.int32)).unsqueeze(0)


def _open_state(tail: bytes) -> tuple[int, int, int]:
    """What a character's first bytes still need: (bytes left, range of the next one)."""
    lead = _lead(tail[0])
    assert lead is not None
    need, lo, hi = lead
    taken = len(tail) - 1
    return (need - taken, lo, hi) if taken == 0 else (need - taken, 0x80, 0xBF)


#: every state :func:`_open_state` can answer
_OPEN_STATES = sorted(
    {(need, lo, hi) for b in range(0xC2, 0xF5) if (lead := _lead(b)) for need, lo, hi in [lead]}
    | {(k, 0x80, 0xBF) for k in (1, 2)}
)


def _goes_on(state: tuple[int, int, int], raw: bytes) -> bool:
    """Whether ``raw`` goes on validly from an open character in ``state``, and is UTF-8 after it."""
    left, lo, hi = state
    for k, b in enumerate(raw[:left]):
        if not (lo <= b <= hi if k == 0 else 0x80 <= b <= 0xBF):
            return False
    return _utf8_walk(raw[left:]) is not None


def _utf8_prefix(tail: bytes, raw: bytes) -> bool:
    """Whether ``tail + raw`` is UTF-8, or the start of it (a character may end in the next token)."""
    return _utf8_walk(tail + raw) is not None


def _incomplete_end(data: bytes) -> bytes:
    """The bytes at the end of ``data`` that start a character not complete yet."""
    at = _utf8_walk(data)
    return b"" if at is None else data[at:]


def _literal(text: str) -> str:
    """``text`` as a regular expression that matches it alone."""
    return "".join("\\" + c if c in "\\^$.|?*+()[]{}/" else c for c in text)
