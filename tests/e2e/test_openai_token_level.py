"""What evaluation and token-level clients send, through the official ``openai`` client
against a real ``servekit serve``: ``echo`` with ``logprobs`` (the prompt scored in the
prefill pass, ``max_tokens: 0``), vLLM's ``prompt_logprobs``, token-id prompts,
``logit_bias``, ``min_tokens``, ``stop_token_ids``, ``allowed_token_ids``, and vLLM's
``/tokenize`` and ``/detokenize`` beside TEI's ``/tokenize`` on the same route.

Models: the tiny GPT-2 (random weights, its own tokenizer) served by the Hugging Face
plugin, whose log-probabilities are checked against transformers run here on the same
folder, and ``ECHO_MODEL_PY``, a model.py with no tokenizer that cannot score a prompt.
"""

from __future__ import annotations

import importlib.util

import httpx
import pytest
from generative_models import ECHO_MODEL_PY, build_tiny_gpt2, write_model
from lazy_modules import lazy_module

pytestmark = pytest.mark.slow  # starts a real server, imports torch

openai = lazy_module("openai")  # looked up at collection, imported by the first test that needs it
# torch and transformers are imported by the test that uses them, not at collection (in every worker)
if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
    pytest.skip("torch and transformers are needed", allow_module_level=True)

PROMPT = "hello world, the quick brown fox"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("token-level")
    gpt = build_tiny_gpt2(base / "gpt")
    write_model(base / "echo", ECHO_MODEL_PY)
    return base, gpt


@pytest.fixture(scope="module")
def server(folders):
    from servekit.testing import ServerProcess

    with ServerProcess(folders[0], env={"HF_HUB_OFFLINE": "1"}) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference(folders):
    """transformers on the same folder: the tokenizer, and a prompt's log-softmax at every position."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(folders[1])
    model = transformers.AutoModelForCausalLM.from_pretrained(folders[1]).eval()

    def logprobs(ids):
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)

    return tokenizer, logprobs


def _error(response: httpx.Response) -> dict:
    assert response.status_code == 400, response.text
    return response.json()["error"]


# -- echo with logprobs: the prompt scored ---------------------------------------------------


def test_echo_with_logprobs_and_max_tokens_0_scores_every_prompt_token(client, reference):
    tokenizer, logprobs = reference
    ids = tokenizer(PROMPT)["input_ids"]
    expected = logprobs(ids)
    result = client.completions.create(model="gpt", prompt=PROMPT, echo=True, logprobs=2, max_tokens=0)
    choice = result.choices[0]
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert result.usage.prompt_tokens == len(ids) and result.usage.completion_tokens == 0
    lp = choice.logprobs
    assert lp.tokens == [tokenizer.decode([t]) for t in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing predicts the first token
    for j in range(1, len(ids)):
        assert lp.token_logprobs[j] == pytest.approx(float(expected[j - 1, ids[j]]), abs=1e-4)
        best = sorted(lp.top_logprobs[j].values(), reverse=True)[:2]  # the two likeliest, and the token's own
        assert best == pytest.approx(expected[j - 1].topk(2).values.tolist(), abs=1e-4)
        assert lp.top_logprobs[j][lp.tokens[j]] == lp.token_logprobs[j]
    assert lp.text_offset == [len(tokenizer.decode(ids[:j])) for j in range(len(ids))]


def test_echo_with_logprobs_then_generated_tokens_follow_the_prompts(client):
    result = client.completions.create(model="gpt", prompt=PROMPT, echo=True, logprobs=1, max_tokens=3, temperature=0)
    plain = client.completions.create(model="gpt", prompt=PROMPT, logprobs=1, max_tokens=3, temperature=0)
    choice, generated = result.choices[0], plain.choices[0]
    assert choice.text == PROMPT + generated.text
    prompt_tokens = result.usage.prompt_tokens
    assert choice.logprobs.tokens[prompt_tokens:] == generated.logprobs.tokens
    assert choice.logprobs.token_logprobs[prompt_tokens:] == pytest.approx(generated.logprobs.token_logprobs)
    assert choice.logprobs.text_offset[prompt_tokens] == len(PROMPT)


def test_streamed_echo_with_logprobs_and_prompt_logprobs_come_first(client):
    """The scored prompt leads each choice's stream: the echoed prompt with its log-probabilities,
    vLLM's ``prompt_logprobs`` beside it; then the generated tokens, offsets after the prompt."""
    ask = {"model": "gpt", "prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 3, "temperature": 0}
    whole = client.completions.create(**ask, extra_body={"prompt_logprobs": 1}).choices[0]
    chunks = [c for c in client.completions.create(**ask, stream=True, extra_body={"prompt_logprobs": 1}) if c.choices]
    first = chunks[0].choices[0]
    assert first.text == PROMPT and first.model_extra["prompt_logprobs"] == whole.model_extra["prompt_logprobs"]
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    streamed = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs is not None]
    assert [t for lp in streamed for t in lp.tokens] == whole.logprobs.tokens
    assert [v for lp in streamed for v in lp.token_logprobs] == pytest.approx(whole.logprobs.token_logprobs)
    assert [o for lp in streamed for o in lp.text_offset] == whole.logprobs.text_offset
    nothing = list(client.completions.create(**{**ask, "max_tokens": 0}, stream=True))
    assert nothing[0].choices[0].text == PROMPT and nothing[0].choices[0].logprobs.token_logprobs[0] is None


def test_prompt_logprobs_in_vllms_shape_on_completions_and_chat(client, reference):
    tokenizer, logprobs = reference
    ids = tokenizer(PROMPT)["input_ids"]
    expected = logprobs(ids)
    result = client.completions.create(model="gpt", prompt=PROMPT, max_tokens=1, extra_body={"prompt_logprobs": 1})
    scored = result.choices[0].model_extra["prompt_logprobs"]
    assert len(scored) == len(ids) and scored[0] is None
    for j in range(1, len(ids)):
        own = scored[j][str(ids[j])]
        assert own["logprob"] == pytest.approx(float(expected[j - 1, ids[j]]), abs=1e-4)
        assert own["rank"] == int((expected[j - 1] > expected[j - 1, ids[j]]).sum()) + 1
        assert own["decoded_token"] == tokenizer.decode([ids[j]])
        assert str(int(expected[j - 1].argmax())) in scored[j]
    chat = client.chat.completions.create(
        model="gpt", messages=[{"role": "user", "content": "hi"}], max_tokens=1, extra_body={"prompt_logprobs": 0}
    )
    chat_scored = chat.model_extra["prompt_logprobs"]
    assert chat_scored[0] is None and len(chat_scored) == chat.usage.prompt_tokens
    assert all(len(position) == 1 for position in chat_scored[1:])  # the token's own, no alternatives


def test_what_cannot_be_scored_is_refused_naming_the_field(server):
    url = server.url + "/v1/completions"
    error = _error(httpx.post(url, json={"model": "echo", "prompt": "a b", "prompt_logprobs": 1}))
    assert error["param"] == "prompt_logprobs" and "does not score the prompt" in error["message"]
    error = _error(httpx.post(url, json={"model": "gpt", "prompt": "a", "max_tokens": 0}))
    assert error["param"] == "max_tokens"
    chat = {"model": "gpt", "messages": [{"role": "user", "content": "a"}], "prompt_logprobs": 1, "stream": True}
    assert _error(httpx.post(server.url + "/v1/chat/completions", json=chat))["param"] == "prompt_logprobs"
    streamed = {"model": "echo", "prompt": "a b", "prompt_logprobs": 1, "stream": True}
    assert _error(httpx.post(url, json=streamed))["param"] == "prompt_logprobs"  # a 400 before the stream starts


# -- token-id prompts -------------------------------------------------------------------------


def test_token_id_prompts_answer_as_their_text_does(client, reference):
    tokenizer, _ = reference
    ids = tokenizer(PROMPT)["input_ids"]
    text = client.completions.create(model="gpt", prompt=PROMPT, max_tokens=4, temperature=0)
    one = client.completions.create(model="gpt", prompt=ids, max_tokens=4, temperature=0)
    several = client.completions.create(model="gpt", prompt=[ids, ids[:3]], max_tokens=4, temperature=0, echo=True)
    assert one.choices[0].text == text.choices[0].text
    assert one.usage.prompt_tokens == len(ids)
    assert [c.index for c in several.choices] == [0, 1]
    assert several.choices[0].text == PROMPT + text.choices[0].text
    assert several.choices[1].text.startswith(tokenizer.decode(ids[:3]))


def test_token_ids_outside_the_vocabulary_or_for_a_model_without_tokenizer_are_refused(server):
    url = server.url + "/v1/completions"
    error = _error(httpx.post(url, json={"model": "gpt", "prompt": [[1, 2], [99999]]}))
    assert error["param"] == "prompt" and "99999" in error["message"]
    error = _error(httpx.post(url, json={"model": "echo", "prompt": [1, 2]}))
    assert error["param"] == "prompt" and "no tokenizer" in error["message"]
    error = _error(httpx.post(url, json={"model": "gpt", "prompt": [[1, 2], []]}))
    assert error["param"] == "prompt"


# -- token rules ------------------------------------------------------------------------------


def test_logit_bias_forces_and_bans_tokens(client, reference):
    tokenizer, _ = reference
    forced = tokenizer(" fox")["input_ids"][0]
    result = client.completions.create(
        model="gpt", prompt="hello", max_tokens=3, temperature=1, seed=3, logit_bias={str(forced): 100}
    )
    assert result.choices[0].text == tokenizer.decode([forced] * 3)
    greedy = client.completions.create(model="gpt", prompt="hello", max_tokens=1, temperature=0, logprobs=0)
    first = tokenizer(greedy.choices[0].logprobs.tokens[0])["input_ids"][0]
    banned = client.completions.create(
        model="gpt", prompt="hello", max_tokens=1, temperature=0, logit_bias={str(first): -100}
    )
    assert banned.choices[0].text != greedy.choices[0].text
    chat = client.chat.completions.create(
        model="gpt",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=2,
        logit_bias={str(forced): 100},
    )
    assert chat.choices[0].message.content == tokenizer.decode([forced] * 2)


def test_allowed_token_ids_min_tokens_and_stop_token_ids(client, reference):
    tokenizer, _ = reference
    fox, dog = tokenizer(" fox")["input_ids"][0], tokenizer(" dog")["input_ids"][0]
    eos = tokenizer.eos_token_id
    allowed = client.completions.create(
        model="gpt", prompt="hello", max_tokens=6, seed=1, extra_body={"allowed_token_ids": [fox, dog]}
    )
    assert set(tokenizer(allowed.choices[0].text)["input_ids"]) <= {fox, dog}
    # the end-of-text token is the likeliest by far, yet min_tokens holds it back
    held = client.completions.create(
        model="gpt",
        prompt="hello",
        max_tokens=8,
        temperature=0,
        logit_bias={str(eos): 50},
        extra_body={"min_tokens": 3},
    )
    assert held.usage.completion_tokens == 4 and held.choices[0].finish_reason == "stop"
    # a stop token id ends the text (its own text left out), after min_tokens
    stopped = client.completions.create(
        model="gpt",
        prompt="hello",
        max_tokens=8,
        temperature=0,
        logit_bias={str(fox): 50},
        extra_body={"stop_token_ids": [fox], "min_tokens": 2},
    )
    choice = stopped.choices[0]
    assert choice.finish_reason == "stop" and stopped.usage.completion_tokens == 3
    assert " fox" not in choice.text and len(tokenizer(choice.text)["input_ids"]) <= 2


def test_token_rules_out_of_range_are_refused_naming_the_field(server):
    url = server.url + "/v1/completions"
    cases = [
        ({"logit_bias": {"99999": 1}}, "logit_bias"),
        ({"logit_bias": {"fox": 1}}, "logit_bias"),
        ({"logit_bias": {"1": 101}}, "logit_bias"),
        ({"allowed_token_ids": [1, 99999]}, "allowed_token_ids"),
        ({"allowed_token_ids": []}, "allowed_token_ids"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"min_tokens": 9, "max_tokens": 4}, "min_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
    ]
    for fields, param in cases:
        error = _error(httpx.post(url, json={"model": "gpt", "prompt": "a", **fields}))
        assert error["param"] == param, (fields, error)
    for fields, param in cases[:1] + [({"min_tokens": 1}, "min_tokens")]:  # a model without a tokenizer
        error = _error(httpx.post(url, json={"model": "echo", "prompt": "a", **fields}))
        assert error["param"] == param and "no tokenizer" in error["message"], (fields, error)


# -- /tokenize and /detokenize ------------------------------------------------------------------


def test_vllm_tokenize_and_detokenize(server, reference):
    tokenizer, _ = reference
    ids = tokenizer(PROMPT)["input_ids"]
    answer = httpx.post(server.url + "/tokenize", json={"model": "gpt", "prompt": PROMPT}).json()
    assert answer == {"count": len(ids), "max_model_len": 256, "tokens": ids, "token_strs": None}
    messages = [{"role": "user", "content": "hi"}]
    chat = httpx.post(
        server.url + "/tokenize", json={"model": "gpt", "messages": messages, "return_token_strs": True}
    ).json()
    formatted = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert chat["tokens"] == tokenizer(formatted, add_special_tokens=False)["input_ids"]
    assert chat["token_strs"] == tokenizer.convert_ids_to_tokens(chat["tokens"])
    back = httpx.post(server.url + "/detokenize", json={"model": "gpt", "tokens": ids}).json()
    assert back == {"prompt": PROMPT}


def test_tokenize_tells_teis_body_from_vllms_and_answers_each_in_its_shape(server):
    tei = httpx.post(server.url + "/tokenize", json={"model": "gpt", "inputs": "hello"})
    assert tei.status_code == 200 and tei.json()[0][0]["text"] == "hello"
    tei_error = httpx.post(server.url + "/tokenize", json={"model": "gpt", "inputs": 5})
    assert tei_error.status_code == 422 and "error_type" in tei_error.json()
    vllm_error = httpx.post(server.url + "/tokenize", json={"model": "gpt", "prompt": 5})
    assert _error(vllm_error)["param"] == "prompt"
    unknown = httpx.post(server.url + "/tokenize", json={"model": "gpt", "prompt": "a", "frobnicate": 1})
    assert _error(unknown)["param"] == "frobnicate"
    outside = httpx.post(server.url + "/detokenize", json={"model": "gpt", "tokens": [1, 99999]})
    assert _error(outside)["param"] == "tokens"
    no_tokenizer = httpx.post(server.url + "/detokenize", json={"model": "echo", "tokens": [1]})
    assert _error(no_tokenizer)["param"] == "model"
