"""Causal language models: completions and chat, continuously batched.

By default every generation of a model runs in one batch
(:mod:`.scheduler`): a request's prompt is prefilled when it joins, then one
forward pass per step decodes the next token of every running sequence, so
sixteen streams cost about what one does.  ``options``: ``max_num_seqs``
(sequences in the batch, default 64), ``max_batched_tokens`` (tokens one step
may process: prefills plus one per running sequence, default 4096) and
``max_queued`` (requests that may wait beyond the batch; default no limit,
beyond it 429), ``prefix_caching`` (default true: prompts that start the same
way compute that start once, :mod:`.prefix_cache`) and ``prefix_cache_mb``
(its budget, default 256).  ``continuous_batching: false`` runs each request's own
``model.generate`` instead, one per request thread, capped by
``max_concurrent_generations``.

Either way each request samples with its own ``torch.Generator`` (seeded from
``seed``), never torch's global one, so a seeded request gives the same text
whatever runs beside it, and greedy decoding gives the same tokens alone and
batched.

Imported only when such a model loads (torch and transformers are heavy).
Streaming: the request's thread reads its tokens as the scheduler produces
them and turns them into text; closing the generator (client gone, stop
sequence found) drops the sequence from the batch at the next step.  Without
continuous batching, ``generate`` runs in a thread feeding transformers'
``TextIteratorStreamer`` and a stopping criterion reads a flag after every token.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import torch
from servekit.errors import BadRequest
from servekit.types import GenerationChunk, GenerationRequest, GenerationResult, GenerationTiming, TokenLogprob
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    StoppingCriteria,
    StoppingCriteriaList,
    TextIteratorStreamer,
)
from transformers.generation.streamers import BaseStreamer

from . import prefix_cache
from .options import positive_option
from .scheduler import Scheduler, Score, Sequence, check_cache
from .token_rules import PromptScore, TokenRules

#: ``max_tokens`` when a chat request sets none and the model has no known context length
DEFAULT_MAX_NEW_TOKENS = 512
#: continuous batching's defaults: sequences in the running batch, tokens one step may process
DEFAULT_MAX_NUM_SEQS = 64
DEFAULT_MAX_BATCHED_TOKENS = 4096


class CausalLM:
    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        device: str,
        options: dict[str, Any],
        name: str = "model",
        version: int = 1,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.context = _context_length(model.config)
        limit = positive_option(options, "max_concurrent_generations")
        self.slots = threading.BoundedSemaphore(limit) if limit else None
        eos = model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.eos_ids), None)
        self.pieces = TokenPieces(tokenizer)
        #: the ids a request may name (the tokenizer's, within the model's logits)
        self.vocabulary = min(len(tokenizer), int(getattr(model.config, "vocab_size", None) or len(tokenizer)))
        self.scheduler = self._scheduler(options, limit, name, version)
        self._grammars: Any = None  # constrained.Grammars, made on the first constrained request
        self._grammars_lock = threading.Lock()

    def _scheduler(self, options: dict[str, Any], limit: int | None, name: str, version: int) -> Scheduler | None:
        continuous = _flag(options, "continuous_batching")
        prefix_caching = _flag(options, "prefix_caching")
        max_num_seqs = positive_option(options, "max_num_seqs") or limit or DEFAULT_MAX_NUM_SEQS
        max_batched_tokens = positive_option(options, "max_batched_tokens") or DEFAULT_MAX_BATCHED_TOKENS
        max_queued = positive_option(options, "max_queued", zero=True)
        cache_mb = positive_option(options, "prefix_cache_mb") or prefix_cache.DEFAULT_MB
        if not continuous:
            return None
        check_cache(self.model, self.device)
        from servekit import generation_gauges

        gauges = generation_gauges(name, str(version))
        kept = prefix_cache.PrefixCache(cache_mb << 20) if prefix_caching else None
        return Scheduler(self.model, self.device, max_num_seqs, max_batched_tokens, max_queued, gauges, kept)

    def close(self) -> None:
        """Stop the scheduler (the model is unloaded)."""
        if self.scheduler is not None:
            self.scheduler.stop()

    # -- one request ----------------------------------------------------------------

    def complete(self, request: GenerationRequest) -> GenerationResult | Iterator[GenerationChunk]:
        if request.constraint is not None:
            self._check_constrained(request)
        if self.scheduler is not None:
            seq, prompt_tokens = self._sequence(request)
            return self._streamed(seq, prompt_tokens) if request.stream else self._scheduled(seq, prompt_tokens)
        kwargs, prompt_tokens = self._generate_kwargs(request)
        if request.stream:
            return self._stream(kwargs, prompt_tokens)
        return self._whole(kwargs, prompt_tokens)

    def _check_constrained(self, request: GenerationRequest) -> None:
        """Structured outputs run in the scheduler, and end with the end-of-text token."""
        assert request.constraint is not None
        param = request.constraint.param
        if self.scheduler is None:
            raise BadRequest(
                f"'{param}' needs continuous batching (decoding under a grammar runs in the scheduler); "
                "this model has options.continuous_batching: false",
                param=param,
            )
        if request.options.get("ignore_eos"):
            raise BadRequest(
                f"'ignore_eos' cannot be used with '{param}': the grammar ends the text", param="ignore_eos"
            )
        if not self.eos_ids:
            raise BadRequest(f"'{param}' needs a model with an end-of-text token", param=param)

    def grammars(self, param: str) -> Any:
        """The model's compiled grammars (:class:`.constrained.Grammars`), made on first use; a 400 naming
        ``param`` where the grammar engine is not installed."""
        with self._grammars_lock:
            if self._grammars is None:
                from .constrained import Grammars

                output = self.model.get_output_embeddings()
                vocab = int(output.weight.shape[0]) if output is not None else int(self.model.config.vocab_size)
                try:
                    self._grammars = Grammars(self.tokenizer, vocab, self.eos_ids)
                except ImportError as exc:  # xgrammar is an extra of its own
                    raise BadRequest(
                        f"'{param}' needs a grammar engine this server lacks ({exc}): install "
                        "servekit[structured-outputs] (docs/structured-outputs.md)",
                        param=param,
                    ) from None
            return self._grammars

    def _prompt(self, request: GenerationRequest) -> Any:
        for key in ("presence_penalty", "frequency_penalty"):
            if request.options.get(key):
                raise BadRequest(
                    f"'{key}' is not supported by Hugging Face models; use 'repetition_penalty'", param=key
                )
        ignore_eos = request.options.get("ignore_eos", False)
        if not isinstance(ignore_eos, bool):
            raise BadRequest(f"'ignore_eos' must be true or false, found {ignore_eos!r}", param="ignore_eos")
        token_ids = getattr(request.prompt, "token_ids", None)
        if token_ids is not None:  # a prompt sent as token ids is read as sent
            ids = torch.tensor([token_ids], dtype=torch.long)
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        return self.tokenizer(request.prompt, return_tensors="pt", add_special_tokens=not request.is_chat)

    def _rules(self, request: GenerationRequest) -> TokenRules | None:
        return TokenRules.of(request.options, self.vocabulary, self.eos_ids)

    def _sampler(self, request: GenerationRequest) -> Sampler | None:
        """The request's sampler (its own generator, seeded from ``seed``); ``None`` for greedy decoding."""
        temperature = 1.0 if request.temperature is None else request.temperature
        if temperature <= 0:
            return None
        generator = torch.Generator(device=self.device)
        if request.seed is not None:
            generator.manual_seed(request.seed)
        else:
            generator.seed()
        options = request.options
        return Sampler(
            temperature, request.top_p or 1.0, options.get("top_k") or 0, options.get("min_p") or 0.0, generator
        )

    def _generate_kwargs(self, request: GenerationRequest) -> tuple[dict[str, Any], int]:
        options = request.options
        for key, asked in (
            ("prompt_logprobs", request.prompt_logprobs is not None),
            ("max_tokens", request.max_tokens == 0),
            ("stop_token_ids", bool(options.get("stop_token_ids"))),
        ):
            if asked:
                raise BadRequest(
                    f"'{key}' (or 'echo' with 'logprobs', 'max_tokens': 0) needs continuous batching; "
                    "this model runs with options.continuous_batching: false",
                    param="echo" if key == "prompt_logprobs" and request.logprobs is not None else key,
                )
        rules = self._rules(request)
        encoded = self._prompt(request)
        prompt_tokens = int(encoded["input_ids"].shape[1])
        max_new = self._max_new_tokens(request, prompt_tokens)
        sampler = self._sampler(request)
        processors: list[Any] = [sampler] if sampler is not None else []
        kwargs: dict[str, Any] = {
            **{k: v.to(self.device) for k, v in encoded.items()},
            "max_new_tokens": max_new,
            # ignore_eos: the end-of-text token is masked until max_tokens (before the sampler draws)
            "min_new_tokens": max_new if options.get("ignore_eos") else 0,
            "do_sample": False,
            "pad_token_id": self.pad_id,
        }
        if options.get("repetition_penalty") is not None:
            kwargs["repetition_penalty"] = float(options["repetition_penalty"])
        if rules is not None:
            processors = [RulesProcessor(rules, prompt_tokens), *processors]
        if request.logprobs is not None:
            kwargs["_recorder"] = recorder = LogprobRecorder(request.logprobs)
            processors = [recorder, *self._own_processors(kwargs, prompt_tokens), *processors]
        kwargs["logits_processor"] = LogitsProcessorList(processors)
        kwargs["_stop"] = request.stop
        return kwargs, prompt_tokens

    def _own_processors(self, kwargs: dict[str, Any], prompt_tokens: int) -> list[Any]:
        """``generate``'s own processors for ``ignore_eos`` and the penalty, run after the recorder instead.

        ``generate`` puts its processors before the ones passed in; the recorder
        must see the raw logits, so these move behind it (same effect, same order).
        """
        own: list[Any] = []
        if kwargs.pop("min_new_tokens") and self.eos_ids:
            own.append(
                MinNewTokensLengthLogitsProcessor(
                    prompt_tokens, kwargs["max_new_tokens"], sorted(self.eos_ids), device=self.device
                )
            )
        if "repetition_penalty" in kwargs:
            own.append(RepetitionPenaltyLogitsProcessor(kwargs.pop("repetition_penalty")))
        return own

    def _max_new_tokens(self, request: GenerationRequest, prompt_tokens: int) -> int:
        room = None if self.context is None else self.context - prompt_tokens
        if room is not None and room <= 0:
            raise BadRequest(
                f"the prompt has {prompt_tokens} tokens; the model's context holds {self.context}",
                param="messages" if request.is_chat else "prompt",
            )
        if request.max_tokens is None:
            return room if room is not None else DEFAULT_MAX_NEW_TOKENS
        if room is not None and request.max_tokens > room:
            raise BadRequest(
                f"'max_tokens' is {request.max_tokens} but the prompt's {prompt_tokens} tokens leave room for "
                f"{room} in the model's context of {self.context}",
                param="max_tokens",
            )
        return request.max_tokens

    def _criteria(self, kwargs: dict[str, Any], flag: threading.Event) -> StoppingCriteriaList:
        prompt_len = kwargs["input_ids"].shape[1]
        return StoppingCriteriaList([StopFlag(flag), StopText(self.tokenizer, kwargs.pop("_stop"), prompt_len)])

    def _finish(self, generated: list[int], max_new: int) -> str:
        if generated and generated[-1] in self.eos_ids:
            return "stop"
        return "length" if len(generated) >= max_new else "stop"

    # -- continuous batching ----------------------------------------------------------

    def _sequence(self, request: GenerationRequest) -> tuple[Sequence, int]:
        """The request as the scheduler runs it (checked here, in the request's thread)."""
        ids = self._prompt(request)["input_ids"][0].tolist()
        if not ids:  # as generate does: an empty prompt starts from the start-of-text token
            bos = self.model.generation_config.bos_token_id
            if bos is None:
                raise BadRequest("the prompt is empty and the model has no start-of-text token", param="prompt")
            ids = [bos]
        max_new = self._max_new_tokens(request, len(ids))
        penalty = request.options.get("repetition_penalty")
        stop = [s for s in request.stop if s]
        rules = self._rules(request)
        stop_ids = rules.stop_ids if rules is not None else frozenset()
        choose: Any = Chooser(self._sampler(request), None if penalty is None else float(penalty), ids, rules)
        if request.constraint is not None:
            from .constrained import ConstrainedChooser

            choose = ConstrainedChooser(self.grammars(request.constraint.param), request.constraint, choose)
        seq = Sequence(
            prompt_ids=ids,
            max_new=max_new,
            choose=choose,
            stopped=StopTail(self.tokenizer, stop) if stop else None,
            # ignore_eos leaves the stop token ids (vLLM's rule)
            eos_ids=(frozenset() if request.options.get("ignore_eos") else frozenset(self.eos_ids)) | stop_ids,
            logprobs=request.logprobs,
            constrained=request.constraint is not None,
            prompt_logprobs=request.prompt_logprobs,
        )
        return seq, len(ids)

    def _text_ids(self, seq: Sequence, ids: list[int]) -> list[int]:
        """The ids whose text the answer holds: a stop token id's is left out (as vLLM leaves it)."""
        if not ids or ids[-1] not in seq.eos_ids:
            return ids
        return ids[:-1]

    def _prompt_logprobs(self, seq: Sequence) -> list[TokenLogprob] | None:
        """The prompt's scored tokens as the framework's entries, the first one unscored."""
        if seq.prompt_logprobs is None:
            return None
        first = self.pieces.token(seq.prompt_ids[0])
        return [first, *(self.pieces.prompt_entry(score) for score in seq.prompt_scores)]

    def _logprobs(self, asked: int | None, scores: list[Score]) -> list[TokenLogprob] | None:
        """The framework's entries for scored tokens (``None`` when the request asked for none)."""
        if asked is None:
            return None
        return [self.pieces.entry(score) for score in scores]

    def _scheduled(self, seq: Sequence, prompt_tokens: int) -> GenerationResult:
        assert self.scheduler is not None
        self.scheduler.submit(seq)
        try:
            for _ in seq.tokens_as_produced(self.scheduler.alive):
                pass
        finally:
            seq.cancel()  # raised while waiting (unload, failure): the scheduler drops it
        # as a stream of the same tokens says it
        text = IncrementalText.joined(self.tokenizer, self._text_ids(seq, seq.tokens))
        logprobs = self._logprobs(seq.logprobs, seq.scores)
        return GenerationResult(
            text,
            seq.finish_reason,
            prompt_tokens,
            len(seq.tokens),
            logprobs=logprobs,
            timing=GenerationTiming(*seq.timing),
            constrained=seq.constrained,
            prompt_logprobs=self._prompt_logprobs(seq),
        )

    def _streamed(self, seq: Sequence, prompt_tokens: int) -> Iterator[GenerationChunk]:
        assert self.scheduler is not None
        self.scheduler.submit(seq)
        text = IncrementalText(self.tokenizer)
        prompt_scored = self._prompt_logprobs  # the first chunk carries them (scored before the first token)
        try:
            produced = 0
            for group in seq.tokens_as_produced(self.scheduler.alive):
                scored = produced
                produced += len(group)
                piece = text.add(self._text_ids(seq, group))  # an ending id is a group's last
                logprobs = self._logprobs(seq.logprobs, seq.scores[scored:produced])
                first_scored = seq.prompt_logprobs is not None and produced == len(group)
                if piece or logprobs or first_scored:
                    yield GenerationChunk(
                        piece,
                        prompt_tokens=prompt_tokens,
                        completion_tokens=produced,
                        logprobs=logprobs,
                        constrained=seq.constrained,
                        prompt_logprobs=prompt_scored(seq) if first_scored else None,
                    )
            rest = self._logprobs(seq.logprobs, [])
            timing = GenerationTiming(*seq.timing)
            yield GenerationChunk(
                text.rest(),
                seq.finish_reason,
                prompt_tokens,
                len(seq.tokens),
                logprobs=rest,
                timing=timing,
                constrained=seq.constrained,
                prompt_logprobs=prompt_scored(seq) if produced == 0 else None,  # max_tokens: 0
            )
        finally:
            seq.cancel()  # client gone or stop sequence: the sequence leaves the batch at the next step

    # -- whole text -------------------------------------------------------------------

    def _whole(self, kwargs: dict[str, Any], prompt_tokens: int) -> GenerationResult:
        kwargs["stopping_criteria"] = self._criteria(kwargs, threading.Event())
        recorder = kwargs.pop("_recorder", None)
        if recorder is not None:
            kwargs["streamer"] = recorder.streamer()  # scores each chosen token as generate picks it
        with _Slot(self.slots):
            output = self.model.generate(**kwargs)
        generated = output[0, prompt_tokens:].tolist()
        text = self.tokenizer.decode(generated, skip_special_tokens=True)
        logprobs = None if recorder is None else self._logprobs(recorder.top, recorder.scores)
        finish = self._finish(generated, kwargs["max_new_tokens"])
        return GenerationResult(text, finish, prompt_tokens, len(generated), logprobs=logprobs)

    # -- streaming --------------------------------------------------------------------

    def _stream(self, kwargs: dict[str, Any], prompt_tokens: int) -> Iterator[GenerationChunk]:
        recorder: LogprobRecorder | None = kwargs.pop("_recorder", None)

        class CountingStreamer(TextIteratorStreamer):
            """Also keeps the generated token ids, for usage and the finish reason (and scores them)."""

            generated: list[int] = []

            def put(self, value: Any) -> None:
                if not (self.skip_prompt and self.next_tokens_are_prompt):
                    ids = value.reshape(-1).tolist()
                    if recorder is not None:
                        recorder.take(ids)  # before the text is handed on: the reader finds the scores
                    self.generated = self.generated + ids
                super().put(value)

        flag = threading.Event()
        streamer = CountingStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        kwargs["stopping_criteria"] = self._criteria(kwargs, flag)
        kwargs["streamer"] = streamer
        failure: list[BaseException] = []

        def run() -> None:
            try:
                with _Slot(self.slots, flag):
                    if not flag.is_set():
                        self.model.generate(**kwargs)
            except BaseException as exc:  # reported to the consumer below
                failure.append(exc)
            finally:
                streamer.end()  # unblocks the consumer whatever happened

        thread = threading.Thread(target=run, name="servekit-hf-generate", daemon=True)
        thread.start()
        asked = None if recorder is None else recorder.top
        scored = 0
        try:
            for text in streamer:
                if text:
                    scores = [] if recorder is None else recorder.scores[scored:]
                    scored += len(scores)
                    logprobs = self._logprobs(asked, scores)
                    count = len(streamer.generated)
                    yield GenerationChunk(text, prompt_tokens=prompt_tokens, completion_tokens=count, logprobs=logprobs)
            thread.join()
            if failure:
                raise failure[0]
            generated = streamer.generated
            rest = self._logprobs(asked, [] if recorder is None else recorder.scores[scored:])
            finish = self._finish(generated, kwargs["max_new_tokens"])
            yield GenerationChunk("", finish, prompt_tokens, len(generated), logprobs=rest)
        finally:
            flag.set()  # client gone or stop sequence: generate stops after the current token
            thread.join()

    # -- explanations -----------------------------------------------------------------

    def attributions(self, prompt: str) -> dict[str, Any]:
        """Gradient x input of each prompt token for the most likely next token."""
        ids = self.tokenizer(prompt, return_tensors="pt")["input_ids"].to(self.device)
        if ids.shape[1] == 0:
            raise BadRequest("cannot explain an empty prompt", param="prompt")
        embeddings = self.model.get_input_embeddings()(ids).detach().requires_grad_(True)
        with torch.enable_grad():
            logits = self.model(inputs_embeds=embeddings).logits[0, -1]
            target = int(logits.argmax())
            # autograd.grad leaves the parameters' .grad untouched (concurrent requests)
            (grad,) = torch.autograd.grad(logits[target], embeddings)
        scores = (grad * embeddings).sum(-1)[0].detach().float().cpu().tolist()
        return {
            "tokens": [self.tokenizer.decode([t]) for t in ids[0].tolist()],
            "attributions": scores,
            "target": self.tokenizer.decode([target]),
        }


class Sampler(LogitsProcessor):
    """A logits processor that draws the next token with the request's own generator.

    Temperature, then top-k, min-p and top-p filtering (OpenAI / vLLM meaning),
    then one draw; every other token is set to -inf so greedy decoding picks it.
    """

    def __init__(self, temperature: float, top_p: float, top_k: int, min_p: float, generator: Any):
        self.temperature, self.top_p, self.top_k, self.min_p = temperature, top_p, top_k, min_p
        self.generator = generator

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        out = torch.full_like(scores, float("-inf"))
        return out.scatter(-1, self.draw(scores), 0.0)

    def draw(self, scores: Any) -> Any:
        """The chosen token of each row (``[rows, 1]``): one draw from the filtered distribution."""
        logits = scores.float() / self.temperature
        if self.top_k and self.top_k > 0 and self.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if self.min_p > 0:
            probs = probs.masked_fill(probs < self.min_p * probs.max(dim=-1, keepdim=True).values, 0.0)
        if self.top_p < 1.0:
            ordered, order = torch.sort(probs, descending=True, dim=-1)
            before = ordered.cumsum(dim=-1) - ordered  # mass of the tokens ranked above each one
            ordered = ordered.masked_fill(before >= self.top_p, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, ordered)
        return torch.multinomial(probs, 1, generator=self.generator)


class RulesProcessor(LogitsProcessor):
    """``generate``'s side of a request's :class:`~.token_rules.TokenRules` (one row)."""

    def __init__(self, rules: TokenRules, prompt_tokens: int):
        self.rules, self.prompt_tokens = rules, prompt_tokens

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        generated = input_ids[0, self.prompt_tokens :].tolist()
        return self.rules(scores[0], generated).unsqueeze(0).to(scores.dtype)


class LogprobRecorder(LogitsProcessor):
    """``generate``'s side of log-probabilities: the raw log-softmax of each step, scored once chosen.

    First in the processor list, so it sees the model's logits before the
    penalty or the sampler change them (as the scheduler scores its rows);
    :meth:`take` (called through a streamer once ``generate`` picked the token)
    records the token's log-probability and the step's ``top`` most likely.
    """

    def __init__(self, top: int):
        self.top = top
        self.last: torch.Tensor | None = None
        self.scores: list[Score] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        self.last = torch.log_softmax(scores[0].float(), dim=-1)
        return scores

    def take(self, ids: list[int]) -> None:
        if self.last is None or not ids:
            return
        top = min(self.top, self.last.shape[-1])
        values, order = self.last.topk(top) if top else (self.last[:0], self.last[:0].long())
        self.scores.append((ids[0], float(self.last[ids[0]]), order.tolist(), values.tolist()))

    def streamer(self) -> BaseStreamer:
        recorder = self

        class Scoring(BaseStreamer):
            prompt = True

            def put(self, value: Any) -> None:
                if self.prompt:  # generate hands the prompt first
                    self.prompt = False
                    return
                recorder.take(value.reshape(-1).tolist())

            def end(self) -> None:
                pass

        return Scoring()


class TokenPieces:
    """Each token id's text and bytes, as the OpenAI answers show them (kept per id).

    The bytes are the token's own: a byte-level BPE token (GPT-2's alphabet) or a
    SentencePiece byte token (``<0xE2>``) may hold part of a character; such a
    token's text is vLLM's ``bytes:\\xe2...`` form.
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.known: dict[int, tuple[str, list[int]]] = {}

    def piece(self, id_: int) -> tuple[str, list[int]]:
        known = self.known.get(id_)
        if known is None:
            raw = self._bytes(id_)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            known = self.known[id_] = (text, list(raw))
        return known

    def entry(self, score: Score) -> TokenLogprob:
        token, logprob, ids, values = score
        top = [self._entry(i, v) for i, v in zip(ids, values)]
        chosen = self._entry(token, logprob)
        chosen.top = top
        return chosen

    def prompt_entry(self, score: PromptScore) -> TokenLogprob:
        """A scored prompt token (with its rank, as vLLM's ``prompt_logprobs`` answer it)."""
        token, logprob, rank, ids, values = score
        chosen = self._entry(token, logprob)
        chosen.rank = rank
        chosen.top = [self._entry(i, v) for i, v in zip(ids, values)]
        return chosen

    def token(self, id_: int) -> TokenLogprob:
        """A token nothing scored (a prompt's first)."""
        text, raw = self.piece(id_)
        return TokenLogprob(text, None, list(raw), token_id=id_)

    def _entry(self, id_: int, logprob: float) -> TokenLogprob:
        text, raw = self.piece(id_)
        return TokenLogprob(text, logprob, list(raw), token_id=id_)

    def _bytes(self, id_: int) -> bytes:
        text = self.tokenizer.decode([id_])
        if "\ufffd" not in text:
            return text.encode()
        piece = self.tokenizer.convert_ids_to_tokens(id_)
        if isinstance(piece, str):
            if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                return bytes([int(piece[3:5], 16)])
            table = _byte_level_alphabet()
            if piece and all(c in table for c in piece):
                return bytes(table[c] for c in piece)
        return text.encode()


class Chooser:
    """Picks a row's next token from its logits: repetition penalty, then the sampler's draw or the argmax.

    The same processors, in the same order, as ``generate`` with this plugin's
    :class:`Sampler`, applied to one row at a time.
    """

    def __init__(
        self, sampler: Sampler | None, penalty: float | None, prompt_ids: list[int], rules: TokenRules | None = None
    ):
        self.sampler = sampler
        self.penalty = None if penalty is None else RepetitionPenaltyLogitsProcessor(penalty)
        self.prompt_ids = prompt_ids
        self.rules = rules  # logit_bias, allowed_token_ids, min_tokens (:mod:`.token_rules`), applied first

    def __call__(self, logits: torch.Tensor, tokens: list[int]) -> int:
        if self.rules is not None:
            logits = self.rules(logits, tokens)
        if self.sampler is None and self.penalty is None:
            return int(logits.argmax())
        scores = logits.float().unsqueeze(0)
        if self.penalty is None and self.sampler is not None:  # the one score the processor leaves finite
            return int(self.sampler.draw(scores))
        if self.penalty is not None:
            ids = torch.tensor([self.prompt_ids + tokens], device=scores.device)
            scores = self.penalty(ids, scores)
        if self.sampler is not None:
            scores = self.sampler(None, scores)
        return int(scores.argmax())


class StopTail:
    """Whether a stop sequence appears in the tail of the generated text (the scheduler then ends it).

    The framework cuts the text exactly; this only saves the tokens after it.
    """

    def __init__(self, tokenizer: Any, stop: list[str]):
        self.tokenizer, self.stop = tokenizer, stop
        self.window = 2 * max(len(s) for s in stop) + 4

    def __call__(self, tokens: list[int]) -> bool:
        text = self.tokenizer.decode(tokens[-self.window :], skip_special_tokens=True)
        return any(s in text for s in self.stop)


class IncrementalText:
    """Generated ids to text as they arrive, never splitting a character that spans tokens.

    Each new piece is the text of the ids after a window of ids already sent,
    minus that window's own text, so a tokenizer that decodes a token
    differently at the start of a text (a leading space) still joins exactly;
    text ending in an incomplete UTF-8 sequence (U+FFFD) waits for the next id
    (up to four of them: bytes that never make a character are sent as U+FFFD).
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # the window's start
        self.read = 0  # the window's end: ids before it are sent

    @classmethod
    def joined(cls, tokenizer: Any, ids: list[int]) -> str:
        """The text a stream of ``ids`` sends in all: what a whole answer says, so both agree."""
        text = cls(tokenizer)
        return text.add(ids) + text.rest()

    def add(self, ids: list[int]) -> str:
        """The text to send now, the ids taken one at a time (however many arrived together, the
        pieces join to the same text)."""
        return "".join(self._add(i) for i in ids)

    def _add(self, id_: int) -> str:
        self.ids.append(id_)
        sent, text = self._texts()
        # a character takes at most 4 bytes: past that, the replacement characters are the text
        whole = not text.endswith("\ufffd") or len(self.ids) - self.read > 4
        if len(text) > len(sent) and whole:
            self.prefix, self.read = self.read, len(self.ids)
            return text[len(sent) :]
        return ""

    def rest(self) -> str:
        """What is left once the sequence ended."""
        sent, text = self._texts()
        self.prefix = self.read = len(self.ids)
        return text[len(sent) :] if len(text) > len(sent) else ""

    def _texts(self) -> tuple[str, str]:
        decode = self.tokenizer.decode
        window = self.ids[self.prefix : self.read]
        return decode(window, skip_special_tokens=True), decode(self.ids[self.prefix :], skip_special_tokens=True)


class StopFlag(StoppingCriteria):
    """Stops ``generate`` once the flag is set (the consumer went away)."""

    def __init__(self, flag: threading.Event):
        self.flag = flag

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        return torch.full((input_ids.shape[0],), self.flag.is_set(), dtype=torch.bool, device=input_ids.device)


class StopText(StoppingCriteria):
    """Stops ``generate`` when a stop sequence appears in the generated text's tail.

    The framework cuts the text exactly; this only saves the tokens after it.
    """

    def __init__(self, tokenizer: Any, stop: list[str], prompt_len: int):
        self.tokenizer, self.stop, self.prompt_len = tokenizer, [s for s in stop if s], prompt_len
        self.window = 2 * max((len(s) for s in self.stop), default=0) + 4

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        done = False
        if self.stop:
            tail = input_ids[0, max(self.prompt_len, input_ids.shape[1] - self.window) :].tolist()
            text = self.tokenizer.decode(tail, skip_special_tokens=True)
            done = any(s in text for s in self.stop)
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


class _Slot:
    """Holds one of ``max_concurrent_generations`` slots (no-op without a limit).

    While waiting, a streaming request whose client went away gives up.
    """

    def __init__(self, slots: threading.BoundedSemaphore | None, cancelled: threading.Event | None = None):
        self.slots, self.cancelled, self.held = slots, cancelled, False

    def __enter__(self) -> _Slot:
        if self.slots is not None:
            while not self.held:
                self.held = self.slots.acquire(timeout=0.5)
                if self.cancelled is not None and self.cancelled.is_set():
                    break
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.held and self.slots is not None:
            self.slots.release()


_ALPHABET: dict[str, int] = {}


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte (the table byte-level BPE tokens are written in)."""
    if not _ALPHABET:
        printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
        extra = [b for b in range(256) if b not in printable]
        for byte in printable:
            _ALPHABET[chr(byte)] = byte
        for n, byte in enumerate(extra):
            _ALPHABET[chr(256 + n)] = byte
    return _ALPHABET


def _flag(options: dict[str, Any], key: str) -> bool:
    """``options[key]`` as a boolean, true when unset."""
    value = options.get(key, True)
    if not isinstance(value, bool):
        raise ValueError(f"options.{key} must be true or false, found {value!r}")
    return value


def _context_length(config: Any) -> int | None:
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
