"""Continuous (iteration-level) batching for causal language models.

One scheduler thread per loaded model owns a *running batch* of sequences and
repeats one step:

1. sequences whose client went away (or that were cancelled) leave the batch;
2. waiting requests join while the batch has room (``max_num_seqs``) and the
   step's token budget allows (``max_batched_tokens``: each running sequence
   costs one token, each joining one the prompt tokens its prefill computes, those
   the prefix cache does not hold).  Joining prompts of
   the same length are prefilled together, in one forward pass without padding
   (sixteen users arriving at once cost one prefill, not sixteen in a row, so
   the last one's first token does not wait behind the others'); a prompt of a
   length of its own is prefilled alone.  A prompt whose first blocks an
   earlier prompt computed starts from their keys and values
   (:mod:`.prefix_cache`), and the pass computes only the rest (prompts that
   share a pass start from as many cached tokens).  The rows' keys and values
   are then added to the batch's cache, left-padded to the batch's length;
3. one forward pass decodes the next token of every sequence that was already
   running: the padding is masked out of attention and each row gets its own
   position ids, so a row computes what it would compute alone;
4. each row's token is chosen by its own sampling settings (greedy, or a draw
   from its own seeded ``torch.Generator``) and handed to its request; finished
   rows (end of text, ``max_tokens``, a stop sequence) leave the batch and free
   their cache.

Requests beyond the batch's room wait in a queue (``max_queued`` bounds it:
beyond, a request is refused with 429).  The request's own thread reads the
tokens as they come and turns them into text, so the scheduler's thread does
nothing but run the model.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from servekit.errors import ModelFailure, NotReady, TooManyRequests

from .prefix_cache import PrefixCache, block_names
from .token_rules import PromptScore, score_prompt

log = logging.getLogger("servekit.huggingface")

#: how often a waiting request checks that the scheduler is still alive
_POLL_SECONDS = 1.0

#: a token's id and log-probability, then the ids and log-probabilities of its step's most likely tokens
Score = tuple[int, float, list[int], list[float]]


@dataclass
class Sequence:
    """One request in the scheduler: its prompt, its settings and what it produced so far."""

    prompt_ids: list[int]
    max_new: int
    #: picks a token from this row's logits (1-D); also sees the ids so far (repetition penalty)
    choose: Callable[[torch.Tensor, list[int]], int]
    #: ``ids -> True`` when a stop sequence appeared in the generated text (None: no stop sequences)
    stopped: Callable[[list[int]], bool] | None = None
    #: end-of-text ids that finish the sequence (empty for ``ignore_eos``)
    eos_ids: frozenset[int] = frozenset()
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    #: what the request's thread reads: token ids, then ``None`` (done) or an exception
    events: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    cancelled: bool = False
    #: ``None``: no log-probabilities; ``N``: each token's, with the step's ``N`` most likely
    logprobs: int | None = None
    #: one :data:`Score` per token in ``tokens`` when ``logprobs`` is set
    scores: list[Score] = field(default_factory=list)
    #: ``choose`` keeps the tokens inside the request's grammar (structured outputs)
    constrained: bool = False
    #: ``None``: the prompt is not scored; ``N``: each prompt token's score, with its position's ``N`` most
    #: likely, in ``prompt_scores`` (computed in the prefill pass, which then starts from no cached prefix)
    prompt_logprobs: int | None = None
    prompt_scores: list[PromptScore] = field(default_factory=list)
    #: the names of the prompt's full blocks (:func:`.prefix_cache.block_names`), once the scheduler asked
    blocks: list[bytes] | None = None
    #: when (``time.monotonic``) it was submitted, joined the batch, and got its first and its last token
    submitted: float = 0.0
    admitted: float = 0.0
    first_token: float | None = None
    last_token: float = 0.0

    @property
    def timing(self) -> tuple[float, float, float]:
        """Seconds it waited for the batch, from joining it to its first token, and from its first token
        to its last (zeros for a phase not reached)."""
        admitted = self.admitted or self.submitted
        first = self.first_token if self.first_token is not None else admitted
        return max(0.0, admitted - self.submitted), max(0.0, first - admitted), max(0.0, self.last_token - first)

    def cancel(self) -> None:
        """The client went away: the scheduler drops the sequence at its next step."""
        self.cancelled = True

    def take(self, token: int, score: Score | None = None) -> bool:
        """Record one generated token (and its score); True when the sequence is finished."""
        self.tokens.append(token)
        if score is not None:
            self.scores.append(score)  # before the token is handed on: the reader finds its score there
        self.events.put(token)
        if token in self.eos_ids:
            self.finish_reason = "stop"
        elif len(self.tokens) >= self.max_new:
            self.finish_reason = "length"
        elif self.stopped is not None and self.stopped(self.tokens):
            self.finish_reason = "stop"
        return self.finish_reason is not None

    def tokens_as_produced(self, alive: Callable[[], bool]) -> Iterator[list[int]]:
        """The generated ids in groups (all that arrived since the last group); ends when the sequence does."""
        while True:
            try:
                item = self.events.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                if not alive():
                    raise NotReady("the model's scheduler stopped; retry") from None
                continue
            group: list[int] = []
            while True:
                if item is None:
                    if group:
                        yield group
                    return
                if isinstance(item, BaseException):
                    raise item
                group.append(item)
                try:
                    item = self.events.get_nowait()
                except queue.Empty:
                    break
            yield group


class Batch:
    """The running sequences and their key/value cache: one row each, left-padded to one length."""

    def __init__(self) -> None:
        self.seqs: list[Sequence] = []
        self.cache: Any = None  # a transformers DynamicCache holding every row
        self.mask: torch.Tensor | None = None  # [rows, length]: 1 for a real position, 0 for padding

    def __len__(self) -> int:
        return len(self.seqs)

    def add(self, seqs: list[Sequence], cache: Any) -> None:
        """Join prefilled sequences with their own cache (one row each, one length: no padding)."""
        length = cache.get_seq_length()
        mask = torch.ones((len(seqs), length), dtype=torch.long, device=_device_of(cache))
        if self.cache is None:
            self.seqs, self.cache, self.mask = list(seqs), cache, mask
            return
        assert self.mask is not None
        width = max(self.mask.shape[1], length)
        for mine, theirs in zip(self.cache.layers, cache.layers):
            mine.keys = torch.cat([_pad_left(mine.keys, width), _pad_left(theirs.keys, width)], dim=0)
            mine.values = torch.cat([_pad_left(mine.values, width), _pad_left(theirs.values, width)], dim=0)
        self.mask = torch.cat([_pad_left(self.mask, width), _pad_left(mask, width)], dim=0)
        self.seqs.extend(seqs)

    def keep(self, rows: list[int]) -> None:
        """Keep only these rows (the others finished or were cancelled) and drop all-padding columns."""
        if not rows:
            self.seqs, self.cache, self.mask = [], None, None
            return
        assert self.mask is not None
        index = torch.tensor(rows, device=self.mask.device)
        mask = self.mask.index_select(0, index)
        used = mask.any(dim=0).nonzero()
        start = int(used[0]) if used.numel() else 0
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, start:]
            layer.values = layer.values.index_select(0, index)[:, :, start:]
        self.mask = mask[:, start:]
        self.seqs = [self.seqs[i] for i in rows]

    def decode(self, forward: Callable[..., Any]) -> torch.Tensor:
        """One forward pass over every row's last token: the next-token logits, one row each."""
        assert self.mask is not None
        device = self.mask.device
        last = torch.tensor([[s.tokens[-1]] for s in self.seqs], device=device)
        positions = self.mask.sum(dim=1, keepdim=True)  # real tokens before this one, padding not counted
        mask = torch.cat([self.mask, torch.ones_like(positions)], dim=1)
        logits = forward(last, mask, self.cache, position_ids=positions)  # the cache grows in place
        self.mask = mask
        return logits[:, -1, :]


class Scheduler:
    """Runs every generation of one model in a single batch, stepping all running sequences together."""

    def __init__(
        self,
        model: Any,
        device: str,
        max_num_seqs: int,
        max_batched_tokens: int,
        max_queued: int | None,
        gauges: Any = None,
        prefix_cache: PrefixCache | None = None,
    ):
        self.model = model
        self.device = device
        self.forward = forward_of(model)
        self.max_num_seqs = max_num_seqs
        self.max_batched_tokens = max_batched_tokens
        self.max_queued = max_queued
        self.gauges = gauges
        #: kept prompt blocks (``None``: every prompt is prefilled whole)
        self.prefix_cache = prefix_cache
        self.waiting: deque[Sequence] = deque()
        self.batch = Batch()
        #: sequences admitted at the current step, being prefilled (counted as running)
        self.joining: list[Sequence] = []
        self.lock = threading.Condition()
        self.thread: threading.Thread | None = None
        self.stopping = False
        #: decoding steps run, the most rows one of them had, and prefill passes run (for tests and the bench)
        self.steps = 0
        self.most_rows = 0
        self.prefills = 0

    # -- the request side -------------------------------------------------------------

    def submit(self, seq: Sequence) -> None:
        """Queue a sequence; it joins the batch at a coming step."""
        with self.lock:
            if self.stopping:
                raise NotReady("the model is being unloaded")
            queued = len(self.waiting) + len(self.batch) - self.max_num_seqs  # beyond the batch's room
            if self.max_queued is not None and queued >= self.max_queued:
                raise TooManyRequests(
                    f"the batch is full and {max(queued, 0)} generations are waiting for a place in it "
                    f"(options.max_queued: {self.max_queued}); retry later"
                )
            seq.submitted = time.monotonic()
            self.waiting.append(seq)
            if self.thread is None:  # started on first use: after the server's fork
                self.thread = threading.Thread(target=self._run, name="servekit-hf-scheduler", daemon=True)
                self.thread.start()
                self._gauge_capacity(self.max_num_seqs)
            self.lock.notify()
        self._gauge()

    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    @property
    def running(self) -> int:
        with self.lock:  # a prefilled group moves from ``joining`` to the batch under the lock
            return len(self.batch) + len(self.joining)

    @property
    def queued(self) -> int:
        return len(self.waiting)

    def stop(self) -> None:
        """Stop the thread; what runs or waits ends with an error (the model is unloaded)."""
        with self.lock:
            self.stopping = True
            self.lock.notify()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout=30)

    # -- the scheduler's thread ---------------------------------------------------------

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                with self.lock:
                    while not self.stopping and not self.waiting and not self.batch.seqs:
                        self.lock.wait()
                    if self.stopping:
                        break
                    joining = self.joining = self._admit()
                self._gauge()
                try:
                    self._step(joining)
                except Exception as exc:  # the batch's forward pass failed: every sequence in it gets the error
                    failure = _failure(exc)
                    for seq in [*self.batch.seqs, *joining]:
                        seq.events.put(failure)
                    self.batch.keep([])
                self.joining = []
                self._gauge()
        gone = NotReady("the model was unloaded while generating; retry")
        with self.lock:
            for seq in [*self.batch.seqs, *self.waiting]:
                seq.events.put(gone)
            self.waiting.clear()
        self.batch.keep([])
        if self.prefix_cache is not None:
            self.prefix_cache.clear()
        self._gauge()
        self._gauge_capacity(0)

    def _admit(self) -> list[Sequence]:
        """Waiting sequences that join at this step (called holding the lock)."""
        for seq in [s for s in self.waiting if s.cancelled]:
            self.waiting.remove(seq)
        budget = self.max_batched_tokens - len(self.batch)
        joining: list[Sequence] = []
        now = time.monotonic()
        while self.waiting and len(self.batch) + len(joining) < self.max_num_seqs:
            cost = self._computed(self.waiting[0])
            if joining and cost > budget:
                break  # waits for the next step; a prompt over the whole budget still runs, on a step of its own
            seq = self.waiting.popleft()
            seq.admitted = now
            joining.append(seq)
            budget -= cost
        return joining

    def _computed(self, seq: Sequence) -> int:
        """The prompt tokens a joining sequence's prefill computes: those the prefix cache does not hold
        (vLLM's scheduler charges a step's budget the same way)."""
        if self.prefix_cache is None or seq.prompt_logprobs is not None:  # a scored prompt is computed whole
            return len(seq.prompt_ids)
        if seq.blocks is None:
            seq.blocks = block_names(seq.prompt_ids)
        return len(seq.prompt_ids) - self.prefix_cache.held(seq.prompt_ids, seq.blocks)

    def _step(self, joining: list[Sequence]) -> None:
        """Prefill the joining prompts, then decode every row, the joined ones included.

        Prefill first, as vLLM's scheduler puts prefills first: a request's first
        token does not wait for the running rows' decoding pass.
        """
        batch = self.batch
        keep = [i for i, s in enumerate(batch.seqs) if not s.cancelled]
        if len(keep) < len(batch):
            for seq in batch.seqs:
                if seq.cancelled:  # the client left: the sequence counts up to its last token
                    self._done(seq)
            batch.keep(keep)
        decoding = len(batch) > 0  # a batch that starts now decodes from the next step
        # every group's cached start is gathered before any prefill keeps blocks (which may drop others)
        groups = [(group, self._cached_start(group, cached)) for group, cached in self._groups(joining)]
        for group, start in groups:
            try:  # a prefill failing fails the requests in it only
                cache, logits = self._prefill(group, start)
            except Exception as exc:
                for seq in group:
                    seq.events.put(_failure(exc))
                continue
            staying = self._advance_prefilled(group, logits)
            if staying and len(staying) < len(group):
                cache.batch_select_indices(torch.tensor(staying, device=logits.device))
            with self.lock:  # counted once: in the batch or still joining, never both
                if staying:
                    batch.add([group[i] for i in staying], cache)
                self.joining = [s for s in self.joining if all(s is not g for g in group)]
        if groups and self.prefix_cache is not None and self.gauges is not None:
            self.gauges.prefix_cache(self.prefix_cache.bytes, self.prefix_cache.max_bytes)
        if decoding and batch.seqs:
            logits = batch.decode(self.forward)
            self.steps += 1
            self.most_rows = max(self.most_rows, len(batch))
            staying = self._advance(batch.seqs, logits)
            if len(staying) < len(batch):
                batch.keep(staying)

    def _advance(self, seqs: list[Sequence], logits: torch.Tensor) -> list[int]:
        """Give each row its next token; the rows that stay (not finished, not failed)."""
        scoring = ScoredRows(seqs, logits)  # before any row's settings touch the logits
        chosen: dict[int, int] = {}
        for i, seq in enumerate(seqs):
            try:
                chosen[i] = seq.choose(logits[i], seq.tokens)
            except Exception as exc:  # its own sampling settings failed: only this row leaves
                seq.events.put(_failure(exc))
        scores = scoring.scores(chosen)
        now = time.monotonic()
        gaps: list[float] = []
        staying = []
        for i, token in chosen.items():
            seq = seqs[i]
            if seq.first_token is None:
                seq.first_token = now
            else:
                gaps.append(now - seq.last_token)
            seq.last_token = now
            try:
                done = seq.take(token, scores.get(i))
            except Exception as exc:  # its stop-sequence check failed: only this row leaves
                seq.events.put(_failure(exc))
                continue
            if done:
                self._done(seq)
                seq.events.put(None)
            else:
                staying.append(i)
        if gaps and self.gauges is not None:
            self.gauges.token_gaps(gaps)
        return staying

    def _advance_prefilled(self, group: list[Sequence], logits: torch.Tensor) -> list[int]:
        """:meth:`_advance` for a prefilled group, but a sequence asked for no new token (``max_tokens: 0``,
        its prompt scored) ends here."""
        ended = [i for i, seq in enumerate(group) if seq.max_new <= 0]
        if not ended:
            return self._advance(group, logits)
        for i in ended:
            group[i].finish_reason = "length"
            group[i].events.put(None)
        rows = [i for i in range(len(group)) if i not in ended]
        if not rows:
            return []
        index = torch.tensor(rows, device=logits.device)
        staying = self._advance([group[i] for i in rows], logits.index_select(0, index))
        return [rows[k] for k in staying]

    def _done(self, seq: Sequence) -> None:
        """A sequence that produced tokens leaves the batch: its timing goes to the gauges."""
        if self.gauges is not None and seq.first_token is not None:
            self.gauges.sequence_done(*seq.timing, len(seq.tokens))

    def _groups(self, joining: list[Sequence]) -> list[tuple[list[Sequence], int]]:
        """The joining sequences by prompt length and cached tokens (in order of each group's first)."""
        groups: dict[tuple[int, int, bool], list[Sequence]] = {}
        for seq in joining:
            if seq.cancelled:
                continue
            cached = 0
            if self.prefix_cache is not None and seq.prompt_logprobs is None:  # a scored prompt is computed whole
                if seq.blocks is None:
                    seq.blocks = block_names(seq.prompt_ids)
                cached = self.prefix_cache.cached(seq.prompt_ids, seq.blocks)
                if self.gauges is not None:
                    self.gauges.prefix_queried.inc(len(seq.prompt_ids))
                    self.gauges.prefix_hit.inc(cached)
            scored = seq.prompt_logprobs is not None
            groups.setdefault((len(seq.prompt_ids), cached, scored), []).append(seq)
        return [(group, cached) for (_, cached, _), group in groups.items()]

    def _cached_start(self, group: list[Sequence], cached: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The group's first ``cached`` tokens' keys and values, every layer (none when nothing is cached)."""
        if not cached or self.prefix_cache is None:
            return []
        return self.prefix_cache.start([seq.blocks or [] for seq in group], cached)

    def _prefill(
        self, group: list[Sequence], start: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[Any, torch.Tensor]:
        """One forward pass over prompts of one length: their cache and first-token logits, a row each.

        ``start``: every layer's keys and values of the prompts' cached first
        tokens, or none; the pass computes the tokens after them.
        """
        from .kv_cache import roomy_cache

        ids = torch.tensor([seq.prompt_ids for seq in group], device=self.device)
        cache = roomy_cache()
        for layer, (keys, values) in enumerate(start):
            cache.update(keys, values, layer)
        cached = start[0][0].shape[-2] if start else 0
        scoring = [(row, seq) for row, seq in enumerate(group) if seq.prompt_logprobs is not None]
        logits = self.forward(ids[:, cached:], torch.ones_like(ids), cache, every_position=bool(scoring))
        self.prefills += 1
        for row, seq in scoring:  # every position's logits: the group was computed from its first token
            seq.prompt_scores = score_prompt(logits[row], seq.prompt_ids, seq.prompt_logprobs or 0)
        if self.prefix_cache is not None:
            for row, seq in enumerate(group):
                self.prefix_cache.keep(seq.blocks or [], cache, row)
        return cache, logits[:, -1, :]

    def _gauge(self) -> None:
        if self.gauges is not None:
            self.gauges.update(self.running, len(self.waiting))

    def _gauge_capacity(self, slots: int) -> None:
        """The batch's places and the prefix cache's budget, while the scheduler runs (0 once stopped)."""
        if self.gauges is not None:
            self.gauges.batch_slots(slots)
            if self.prefix_cache is not None:
                self.gauges.prefix_cache(
                    self.prefix_cache.bytes if slots else 0, self.prefix_cache.max_bytes if slots else 0
                )


class ScoredRows:
    """The log-probabilities of one step, for the rows that asked for them only.

    One log-softmax over those rows' raw logits (before repetition penalty,
    temperature or top-p: vLLM's default ``raw_logprobs``), one top-k for the
    most alternatives any of them wants and, once the rows chose, one gather of
    the chosen tokens' values: two transfers from the device per step, none
    when no row asked.
    """

    def __init__(self, seqs: list[Sequence], logits: torch.Tensor):
        self.wanted = {i: n for i, seq in enumerate(seqs) if (n := seq.logprobs) is not None}
        self.logprobs: torch.Tensor | None = None
        self.top: tuple[list[list[float]], list[list[int]]] = ([], [])
        if not self.wanted:
            return
        index = torch.tensor(list(self.wanted), device=logits.device)
        self.logprobs = torch.log_softmax(logits.index_select(0, index).float(), dim=-1)
        most = min(max(self.wanted.values()), self.logprobs.shape[-1])
        if most:
            values, ids = self.logprobs.topk(most, dim=-1)
            self.top = (values.tolist(), ids.tolist())

    def scores(self, chosen: dict[int, int]) -> dict[int, Score]:
        """Each asking row's :data:`Score` for the token it chose."""
        if self.logprobs is None:
            return {}
        place = [(k, row) for k, row in enumerate(self.wanted) if row in chosen]
        if not place:
            return {}
        ks = torch.tensor([k for k, _ in place], device=self.logprobs.device)
        tokens = torch.tensor([chosen[row] for _, row in place], device=self.logprobs.device)
        values = self.logprobs[ks, tokens].tolist()
        out: dict[int, Score] = {}
        for (k, row), value in zip(place, values):
            n = self.wanted[row]
            top_ids, top_values = (self.top[1][k][:n], self.top[0][k][:n]) if n else ([], [])
            out[row] = (chosen[row], value, top_ids, top_values)
        return out


def forward_of(model: Any) -> Callable[..., torch.Tensor]:
    """``forward(ids, mask, cache, **kw) -> logits`` of the last position (of every position with
    ``every_position``: a scored prompt's prefill), filling ``cache`` in place.

    Transformers 5 names the cache argument ``cache`` (``past_key_values`` before).
    """
    import inspect

    parameters = inspect.signature(model.forward).parameters
    name = "cache" if "cache" in parameters else "past_key_values"
    last_only = {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}

    def forward(
        ids: torch.Tensor, mask: torch.Tensor, cache: Any, every_position: bool = False, **kwargs: Any
    ) -> torch.Tensor:
        keep = {} if every_position else last_only
        out = model(input_ids=ids, attention_mask=mask, use_cache=True, **{name: cache}, **keep, **kwargs)
        return out.logits

    return forward


def check_cache(model: Any, device: str) -> None:
    """Refuse a model whose cache the scheduler cannot join rows of (a prefill of one token, at load)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.inference_mode():
        ids = torch.zeros((1, 1), dtype=torch.long, device=device)
        forward_of(model)(ids, torch.ones_like(ids), cache)
    layers = getattr(cache, "layers", None)
    if not layers or not all(type(layer).__name__ == "DynamicLayer" for layer in layers):
        raise ValueError(
            f"{type(model).__name__} keeps a cache continuous batching cannot share "
            f"({type(cache).__name__}); set options.continuous_batching: false"
        )


def _failure(exc: Exception) -> ModelFailure:
    log.warning("generation failed: %s", exc, exc_info=log.isEnabledFor(logging.DEBUG))
    return ModelFailure(f"generation failed: {type(exc).__name__}: {exc}")


def _pad_left(t: torch.Tensor, width: int) -> torch.Tensor:
    """``t`` with zeros added before its sequence axis (the last-but-one of a cache, the last of a mask)."""
    axis = -2 if t.dim() == 4 else -1
    missing = width - t.shape[axis]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[axis] = missing
    return torch.cat([t.new_zeros(shape), t], dim=axis)


def _device_of(cache: Any) -> torch.device:
    return cache.layers[0].keys.device
