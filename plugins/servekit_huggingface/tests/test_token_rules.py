"""Token rules and prompt scoring in the Hugging Face plugin, in-process: ``logit_bias``,
``allowed_token_ids``, ``min_tokens`` and ``stop_token_ids`` through the continuous-batching
scheduler and through ``generate``; the prompt's tokens scored in the prefill pass (alone and
prefilled in one batch with prompts that are not scored, with ``max_tokens: 0``), checked
against a plain forward pass; what ``generate`` cannot do refused with a 400 naming it.

Model: the tiny GPT-2 (random weights).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from generative_models import build_tiny_gpt2, load_causal
from servekit.errors import BadRequest
from servekit.types import GenerationRequest, TokenIds

pytestmark = pytest.mark.slow  # imports torch
torch = pytest.importorskip("torch")

PROMPT = "the quick brown fox jumps over"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_gpt2(tmp_path_factory.mktemp("rules") / "gpt", n_positions=128)


@pytest.fixture(scope="module", params=["scheduler", "generate"])
def model(request, folder):
    loaded = load_causal(folder, continuous_batching=request.param == "scheduler", prefix_caching=True)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def scheduled(folder):
    loaded = load_causal(folder, prefix_caching=True)
    yield loaded
    loaded.close()


def ids_of(model, text):
    return model.tokenizer(text)["input_ids"]


def generate(model, prompt=PROMPT, **fields):
    options = fields.pop("options", {})
    return model.complete(GenerationRequest(prompt=prompt, temperature=0, options=options, **fields))


def test_logit_bias_and_allowed_token_ids(model):
    fox, dog = ids_of(model, " fox")[0], ids_of(model, " dog")[0]
    forced = generate(model, max_tokens=4, options={"logit_bias": {fox: 100}})
    assert forced.text == " fox" * 4
    free = generate(model, max_tokens=1)
    banned = generate(model, max_tokens=1, options={"logit_bias": {ids_of(model, free.text)[0]: -100}})
    assert banned.text != free.text
    allowed = model.complete(
        GenerationRequest(prompt=PROMPT, max_tokens=6, seed=5, options={"allowed_token_ids": [fox, dog]})
    )
    assert set(ids_of(model, allowed.text)) <= {fox, dog}


def test_min_tokens_holds_back_the_end_of_text(model):
    eos = model.tokenizer.eos_token_id
    ended = generate(model, max_tokens=8, options={"logit_bias": {eos: 50}})
    assert ended.completion_tokens == 1 and ended.finish_reason == "stop"
    held = generate(model, max_tokens=8, options={"logit_bias": {eos: 50}, "min_tokens": 3})
    assert held.completion_tokens == 4 and held.finish_reason == "stop"


def test_ids_outside_the_vocabulary_are_refused_naming_the_field(model):
    for key, value in (("logit_bias", {10**6: 1.0}), ("allowed_token_ids", [-1]), ("stop_token_ids", [10**6])):
        with pytest.raises(BadRequest) as info:
            generate(model, max_tokens=1, options={key: value})
        assert info.value.param == key


def test_stop_token_ids_end_the_text_without_their_own(scheduled):
    fox = ids_of(scheduled, " fox")[0]
    result = generate(scheduled, max_tokens=8, options={"logit_bias": {fox: 50}, "stop_token_ids": [fox]})
    assert (result.text, result.finish_reason, result.completion_tokens) == ("", "stop", 1)
    streamed = list(
        scheduled.complete(
            GenerationRequest(
                prompt=PROMPT,
                temperature=0,
                max_tokens=8,
                stream=True,
                options={"logit_bias": {fox: 50}, "stop_token_ids": [fox], "min_tokens": 2},
            )
        )
    )
    assert streamed[-1].finish_reason == "stop" and streamed[-1].completion_tokens == 3
    assert " fox" not in "".join(chunk.text for chunk in streamed)


def reference_scores(model, ids):
    with torch.no_grad():
        logits = model.model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def test_the_prompt_is_scored_in_the_prefill_pass(scheduled):
    ids = ids_of(scheduled, PROMPT)
    expected = reference_scores(scheduled, ids)
    result = generate(scheduled, prompt=TokenIds(PROMPT, ids), max_tokens=0, prompt_logprobs=3)
    assert (result.text, result.finish_reason, result.completion_tokens) == ("", "length", 0)
    first, *scored = result.prompt_logprobs
    assert first.logprob is None and first.token_id == ids[0]
    assert [entry.token_id for entry in scored] == ids[1:]
    for j, entry in enumerate(scored):
        row = expected[j]
        assert entry.logprob == pytest.approx(float(row[ids[j + 1]]), abs=1e-4)
        assert entry.rank == int((row > row[ids[j + 1]]).sum()) + 1
        assert [t.token_id for t in entry.top] == row.topk(3).indices.tolist()


def test_scored_and_free_prompts_of_one_length_prefill_together_and_score_the_same(scheduled):
    """Prompts of one length join one prefill; the scored one computes every position, the
    others' answers do not change, and a cached prefix does not cut the scored one short."""
    ids = ids_of(scheduled, PROMPT)
    alone = generate(scheduled, prompt=TokenIds(PROMPT, ids), max_tokens=2, prompt_logprobs=0)
    free_alone = generate(scheduled, prompt=TokenIds(PROMPT, ids), max_tokens=4)
    requests = [GenerationRequest(prompt=TokenIds(PROMPT, ids), temperature=0, max_tokens=4) for _ in range(3)]
    requests.append(GenerationRequest(prompt=TokenIds(PROMPT, ids), temperature=0, max_tokens=2, prompt_logprobs=0))
    requests.append(GenerationRequest(prompt=TokenIds(PROMPT, ids), temperature=0, max_tokens=0, prompt_logprobs=0))
    with ThreadPoolExecutor(len(requests)) as pool:
        results = list(pool.map(scheduled.complete, requests))
    assert [r.text for r in results[:3]] == [free_alone.text] * 3
    for scored in results[3:]:
        assert [e.logprob for e in scored.prompt_logprobs[1:]] == pytest.approx(
            [e.logprob for e in alone.prompt_logprobs[1:]], abs=1e-4
        )
    assert results[3].text == alone.text and results[4].completion_tokens == 0


def test_generate_refuses_what_needs_the_scheduler(folder):
    plain = load_causal(folder, continuous_batching=False)
    cases = [
        ({"prompt_logprobs": 1}, "prompt_logprobs"),
        ({"prompt_logprobs": 1, "logprobs": 1}, "echo"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"options": {"stop_token_ids": [1]}}, "stop_token_ids"),
    ]
    for fields, param in cases:
        with pytest.raises(BadRequest) as info:
            generate(plain, **{"max_tokens": 2, **fields})
        assert info.value.param == param
