"""Causal language models: completions and chat through ``model.generate``.

Concurrency: generations run at once, one per request thread (``--threads``
per worker), sharing the weights read-only; ``options.max_concurrent_generations``
caps them (others wait their turn).  Sampling does not use torch's global random
generator, which concurrent requests would share: :class:`Sampler` draws each
token with the request's own ``torch.Generator`` (seeded from ``seed``) and
``generate`` then runs greedily over the single token left, so a seeded request
gives the same text whatever runs beside it.

Imported only when such a model loads (torch and transformers are heavy).
Streaming runs ``generate`` in a thread feeding transformers' ``TextIteratorStreamer``;
closing the generator (client gone, stop sequence found) sets a flag that a
stopping criterion reads after every token, and waits for the thread to end.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import torch
from servekit.errors import BadRequest
from servekit.generation import GenerationChunk, GenerationRequest, GenerationResult
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
    TextIteratorStreamer,
)

#: ``max_tokens`` when a chat request sets none and the model has no known context length
DEFAULT_MAX_NEW_TOKENS = 512


class CausalLM:
    def __init__(self, model: Any, tokenizer: Any, device: str, options: dict[str, Any]):
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.context = _context_length(model.config)
        limit = options.get("max_concurrent_generations")
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            raise ValueError(f"options.max_concurrent_generations must be a positive integer, found {limit!r}")
        self.slots = threading.BoundedSemaphore(limit) if limit else None
        eos = model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.eos_ids), None)

    # -- one request ----------------------------------------------------------------

    def complete(self, request: GenerationRequest) -> GenerationResult | Iterator[GenerationChunk]:
        kwargs, prompt_tokens = self._generate_kwargs(request)
        if request.stream:
            return self._stream(kwargs, prompt_tokens)
        return self._whole(kwargs, prompt_tokens)

    def _generate_kwargs(self, request: GenerationRequest) -> tuple[dict[str, Any], int]:
        options = request.options
        for key in ("presence_penalty", "frequency_penalty"):
            if options.get(key):
                raise BadRequest(
                    f"'{key}' is not supported by Hugging Face models; use 'repetition_penalty'", param=key
                )
        encoded = self.tokenizer(request.prompt, return_tensors="pt", add_special_tokens=not request.is_chat)
        prompt_tokens = int(encoded["input_ids"].shape[1])
        max_new = self._max_new_tokens(request, prompt_tokens)
        generator = torch.Generator(device=self.device)
        if request.seed is not None:
            generator.manual_seed(request.seed)
        else:
            generator.seed()
        processors = []
        temperature = 1.0 if request.temperature is None else request.temperature
        if temperature > 0:
            processors.append(
                Sampler(
                    temperature, request.top_p or 1.0, options.get("top_k") or 0, options.get("min_p") or 0.0, generator
                )
            )
        kwargs: dict[str, Any] = {
            **{k: v.to(self.device) for k, v in encoded.items()},
            "max_new_tokens": max_new,
            "min_new_tokens": 0,
            "do_sample": False,
            "logits_processor": LogitsProcessorList(processors),
            "pad_token_id": self.pad_id,
        }
        if options.get("repetition_penalty") is not None:
            kwargs["repetition_penalty"] = float(options["repetition_penalty"])
        kwargs["_stop"] = request.stop
        return kwargs, prompt_tokens

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

    # -- whole text -------------------------------------------------------------------

    def _whole(self, kwargs: dict[str, Any], prompt_tokens: int) -> GenerationResult:
        kwargs["stopping_criteria"] = self._criteria(kwargs, threading.Event())
        with _Slot(self.slots):
            output = self.model.generate(**kwargs)
        generated = output[0, prompt_tokens:].tolist()
        text = self.tokenizer.decode(generated, skip_special_tokens=True)
        return GenerationResult(text, self._finish(generated, kwargs["max_new_tokens"]), prompt_tokens, len(generated))

    # -- streaming --------------------------------------------------------------------

    def _stream(self, kwargs: dict[str, Any], prompt_tokens: int) -> Iterator[GenerationChunk]:
        class CountingStreamer(TextIteratorStreamer):
            """Also keeps the generated token ids, for usage and the finish reason."""

            generated: list[int] = []

            def put(self, value: Any) -> None:
                if not (self.skip_prompt and self.next_tokens_are_prompt):
                    self.generated = self.generated + value.reshape(-1).tolist()
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
        try:
            for text in streamer:
                if text:
                    yield GenerationChunk(text, prompt_tokens=prompt_tokens, completion_tokens=len(streamer.generated))
            thread.join()
            if failure:
                raise failure[0]
            generated = streamer.generated
            yield GenerationChunk("", self._finish(generated, kwargs["max_new_tokens"]), prompt_tokens, len(generated))
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
        chosen = torch.multinomial(probs, 1, generator=self.generator)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter(-1, chosen, 0.0)


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


def _context_length(config: Any) -> int | None:
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
