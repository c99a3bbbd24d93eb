"""Automatic prefix caching in the Hugging Face plugin's scheduler, in-process on tiny real models:
prompts that share their first blocks compute only the rest and still answer what they answer
with the cache off (greedy and seeded, GPT-2's learned positions and Llama's rotary ones), a
prompt held whole recomputes its last token, the budget drops the least recently used blocks,
and ``/metrics``' counters follow the lookups.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest
from generative_models import load_causal
from servekit.dataplane.generation import GenerationRequest

# needs torch or TensorFlow (or TF Serving's protos, which import TensorFlow): out of the quick lane
pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")
from servekit_huggingface.kv_cache import roomy_cache
from servekit_huggingface.prefix_cache import BLOCK, PrefixCache, block_names
from servekit_huggingface.scheduler import forward_of

#: a long shared start, as a system prompt is, then each user's own question
SYSTEM = "you are a helpful assistant who answers in short sentences. "
QUESTIONS = ["what is the weather like?", "hello there", "tell me a story about a fox", "why?"]


def tokens(model, prompt: str, **kw) -> list[int]:
    seq, prompt_tokens = model._sequence(GenerationRequest(prompt=prompt, max_tokens=16, **kw))
    model._scheduled(seq, prompt_tokens)
    return seq.tokens


def test_block_names_stand_for_the_whole_prefix():
    a = list(range(40))
    b = [*range(16), *range(100, 124)]  # the same first block, then other tokens
    c = [*range(16, 32), *range(16)]  # the first block's tokens again, but second
    assert len(block_names(a)) == 2 and len(block_names(list(range(15)))) == 0
    assert block_names(a)[0] == block_names(b)[0]
    assert block_names(a)[1] != block_names(b)[1]
    assert block_names(c)[1] != block_names(a)[0]  # a block's name depends on what came before it


@pytest.mark.parametrize("kind", ["tiny_gpt2", "tiny_llama"])
@pytest.mark.parametrize(
    "settings",
    [pytest.param({"temperature": 0}, id="greedy"), pytest.param({"temperature": 1.0, "seed": 7}, id="seeded")],
)
def test_the_same_tokens_with_and_without_the_cache(kind, settings, request):
    folder = request.getfixturevalue(kind)
    cached, plain = load_causal(folder, name=f"cached-{kind}"), load_causal(folder, prefix_caching=False)
    try:
        assert plain.scheduler.prefix_cache is None
        prompts = [SYSTEM + q for q in QUESTIONS]
        shared = len(block_names(cached.tokenizer(SYSTEM)["input_ids"])) * BLOCK
        assert shared >= 2 * BLOCK  # the shared start spans blocks
        kw = {**settings, "options": {"ignore_eos": True}}
        expected = [tokens(plain, p, **kw) for p in prompts]
        assert plain.scheduler.prefix_cache is None
        first = [tokens(cached, p, **kw) for p in prompts]  # the first fills the cache, the others start from it
        found = cached.scheduler.prefix_cache
        assert found.hit >= (len(prompts) - 1) * shared
        rng = random.Random(0)

        def staggered(i: int) -> list[int]:
            import time

            time.sleep(rng.random() * 0.03)  # they join running rows, several in one prefill
            return tokens(cached, prompts[i % len(prompts)], **kw)

        with ThreadPoolExecutor(12) as pool:
            batched = list(pool.map(staggered, range(12)))
        assert first == expected
        assert batched == [expected[i % len(prompts)] for i in range(12)]
    finally:
        cached.close()
        plain.close()


def test_a_prompt_held_whole_recomputes_its_last_token(tiny_gpt2):
    model = load_causal(tiny_gpt2)
    try:
        ids = model.tokenizer(SYSTEM * 3)["input_ids"][: 2 * BLOCK]  # exactly two blocks
        prompt = model.tokenizer.decode(ids)
        assert model.tokenizer(prompt)["input_ids"] == ids
        cache = model.scheduler.prefix_cache
        first = tokens(model, prompt, temperature=0, options={"ignore_eos": True})
        before = cache.hit
        again = tokens(model, prompt, temperature=0, options={"ignore_eos": True})
        assert cache.hit - before == 2 * BLOCK - 1  # every block is there; the last token is computed
        assert again == first
    finally:
        model.close()


@pytest.mark.parametrize("caching", [True, False])
def test_the_step_budget_charges_only_the_tokens_a_prefill_computes(tiny_gpt2, caching):
    """``max_batched_tokens`` 24 and prompts of 40 tokens whose first 32 are kept: two of them cost 8
    each and join one step, prefilled in one pass; with the cache off each costs 40, and the second
    waits for a step of its own."""
    model = load_causal(tiny_gpt2, name=f"budget-{caching}", max_batched_tokens=24, prefix_caching=caching)
    try:
        ids = model.tokenizer(SYSTEM * 4)["input_ids"][: 2 * BLOCK + 8]
        prompt = model.tokenizer.decode(ids)
        assert model.tokenizer(prompt)["input_ids"] == ids
        kw = {"temperature": 0, "options": {"ignore_eos": True}}
        alone = tokens(model, prompt, **kw)  # fills the cache (when on)
        scheduler = model.scheduler
        pair = [model._sequence(GenerationRequest(prompt=prompt, max_tokens=16, **kw))[0] for _ in range(2)]
        before = scheduler.prefills
        with scheduler.lock:  # both wait before the scheduler's next admission
            for seq in pair:
                scheduler.submit(seq)
        for seq in pair:
            for _ in seq.tokens_as_produced(scheduler.alive):
                pass
        assert [seq.tokens for seq in pair] == [alone, alone]
        assert scheduler.prefills - before == (1 if caching else 2)
    finally:
        model.close()


def prefilled(model, texts: list[str]) -> tuple[list[list[int]], object]:
    """One prefill of prompts of one length (what the scheduler's pass leaves): their ids and cache."""
    ids = [model.tokenizer(t)["input_ids"] for t in texts]
    cache = roomy_cache()
    with torch.inference_mode():
        batch = torch.tensor(ids)
        forward_of(model.model)(batch, torch.ones_like(batch), cache)
    return ids, cache


def test_the_budget_drops_the_least_recently_used_blocks(tiny_gpt2):
    model = load_causal(tiny_gpt2, prefix_caching=False)
    try:
        texts = ["a" * 40, "b" * 40, "c" * 40]
        ids, cache = prefilled(model, texts)
        assert len({len(i) for i in ids}) == 1 and len(ids[0]) >= BLOCK
        one = PrefixCache(max_bytes=1 << 30)
        one.keep(block_names(ids[0])[:1], cache, 0)
        size = one.bytes
        kept = PrefixCache(max_bytes=2 * size)  # room for two blocks
        names = [block_names(i)[:1] for i in ids]
        kept.keep(names[0], cache, 0)
        kept.keep(names[1], cache, 1)
        assert kept.cached(ids[0], names[0]) == BLOCK  # a hit makes the first block the most recent
        kept.keep(names[2], cache, 2)
        assert len(kept) == 2 and kept.bytes == 2 * size
        assert kept.cached(ids[1], names[1]) == 0  # the least recently used went
        assert kept.cached(ids[0], names[0]) == BLOCK
        assert kept.cached(ids[2], names[2]) == BLOCK
        start = kept.start([names[0], names[2]], BLOCK)
        layer = cache.layers[0]
        assert torch.equal(start[0][0], layer.keys[[0, 2], :, :BLOCK])
        assert torch.equal(start[-1][1], cache.layers[-1].values[[0, 2], :, :BLOCK])
    finally:
        model.close()


def test_a_block_over_the_whole_budget_is_not_kept(tiny_gpt2):
    model = load_causal(tiny_gpt2, prefix_caching=False)
    try:
        ids, cache = prefilled(model, ["a" * 40])
        kept = PrefixCache(max_bytes=16)
        kept.keep(block_names(ids[0]), cache, 0)
        assert len(kept) == 0 and kept.bytes == 0
    finally:
        model.close()


def test_the_counters_follow_the_lookups(tiny_gpt2):
    from prometheus_client import REGISTRY

    model = load_causal(tiny_gpt2, name="prefix-counted")
    labels = {"model": "prefix-counted", "version": "1"}
    try:
        prompt = SYSTEM + QUESTIONS[0]
        length = len(model.tokenizer(prompt)["input_ids"])
        tokens(model, prompt, temperature=0)
        tokens(model, prompt, temperature=0)
        assert REGISTRY.get_sample_value("servekit_prefix_cache_queries_total", labels) == 2 * length
        hits = REGISTRY.get_sample_value("servekit_prefix_cache_hits_total", labels)
        assert hits == model.scheduler.prefix_cache.hit == min(length // BLOCK * BLOCK, length - 1)
    finally:
        model.close()


@pytest.mark.parametrize(
    "options, message",
    [
        ({"prefix_caching": "yes"}, "options.prefix_caching must be true or false"),
        ({"prefix_cache_mb": 0}, "options.prefix_cache_mb must be a positive integer"),
    ],
)
def test_bad_options_are_refused_at_load(tiny_gpt2, options, message):
    with pytest.raises(ValueError, match=message):
        load_causal(tiny_gpt2, **options)
