"""Log-probabilities (``logprobs``, ``top_logprobs``) of the Hugging Face plugin and the OpenAI API.

Every value is checked against torch's ``log_softmax`` of the model's own logits
for the generated ids, computed here with a plain forward pass: through the
continuous-batching scheduler (alone and batched, greedy and sampled, with a
repetition penalty) and through ``generate``, whole and streamed.  Then the
official ``openai`` client against a real ``servekit serve``: completions and
chat, streamed and not (the model in the worker and in a model host), and the
400s for bad values.
"""

from __future__ import annotations

import math
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from generative_models import build_tiny_gpt2
from servekit.dataplane.generation import GenerationRequest, TokenLogprob, collect, text_offsets, token_length
from servekit.types import ModelConfig

# needs torch or TensorFlow (or TF Serving's protos, which import TensorFlow): out of the quick lane
pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")
from servekit_huggingface import loader

PROMPTS = ["hello world", "the quick brown fox jumps over", "hi", "servekit serves models over many protocols"]
#: float tolerance between a batched forward pass and one alone (float32 on CPU)
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def gpt_dir(tmp_path_factory) -> Path:
    return build_tiny_gpt2(tmp_path_factory.mktemp("gpt") / "gpt", n_positions=128)


@pytest.fixture(scope="module")
def models(gpt_dir):
    """The folder loaded twice: continuously batched, and with ``generate`` per request."""
    loaded = {
        "scheduler": loader.load_folder(gpt_dir, ModelConfig(options={}), "gpt", 1),
        "generate": loader.load_folder(gpt_dir, ModelConfig(options={"continuous_batching": False}), "gpt", 1),
    }
    yield loaded
    for model in loaded.values():
        model.close()


def reference(model, prompt_ids: list[int], generated: list[int]) -> torch.Tensor:
    """``log_softmax`` of the model's logits at each generated position: ``[len(generated), vocab]``."""
    with torch.inference_mode():
        ids = torch.tensor([prompt_ids + generated[:-1]])
        logits = model.model(input_ids=ids).logits[0, len(prompt_ids) - 1 :]
    return torch.log_softmax(logits.float(), dim=-1)


def check_against_reference(model, prompt: str, generated: list[int], entries: list[TokenLogprob], top: int) -> None:
    assert len(entries) == len(generated)
    expected = reference(model, model.tokenizer(prompt)["input_ids"], generated)
    for step, (token, entry) in enumerate(zip(generated, entries)):
        assert math.isclose(entry.logprob, float(expected[step, token]), abs_tol=TOLERANCE), step
        assert entry.bytes == list(model.pieces.piece(token)[1])
        values, ids = expected[step].topk(top)
        assert [t.logprob for t in entry.top] == pytest.approx(values.tolist(), abs=TOLERANCE)
        assert [t.token for t in entry.top] == [model.pieces.piece(i)[0] for i in ids.tolist()]
        assert all(a.logprob >= b.logprob for a, b in zip(entry.top, entry.top[1:]))  # sorted, most likely first


def scheduled(model, prompt: str, **kw):
    """The ids the scheduler generated and the logprobs it answered."""
    seq, prompt_tokens = model._sequence(GenerationRequest(prompt=prompt, **kw))
    result = model._scheduled(seq, prompt_tokens)
    return seq.tokens, result


SETTINGS = [
    pytest.param({"temperature": 0}, id="greedy"),
    pytest.param({"temperature": 1.5, "top_p": 0.8, "seed": 5, "options": {"top_k": 30}}, id="sampled"),
    pytest.param({"temperature": 0, "options": {"repetition_penalty": 2.0}}, id="greedy-penalty"),
]


def with_defaults(settings: dict, **kw) -> dict:
    return {"max_tokens": 10, **settings, **kw, "options": {"ignore_eos": True, **settings.get("options", {})}}


@pytest.mark.parametrize("settings", SETTINGS)
def test_scheduler_logprobs_are_the_raw_distributions(models, settings):
    """Before temperature, top-p, top-k or the penalty (vLLM's default ``raw_logprobs``)."""
    model = models["scheduler"]
    for prompt in PROMPTS[:2]:
        ids, result = scheduled(model, prompt, **with_defaults(settings, logprobs=4))
        check_against_reference(model, prompt, ids, result.logprobs, 4)
        if settings.get("temperature") == 0 and "options" not in settings:
            assert all(e.top[0].token == e.token for e in result.logprobs)  # greedy: the chosen is the most likely


def test_rows_that_ask_for_nothing_get_nothing(models):
    model = models["scheduler"]
    seq, prompt_tokens = model._sequence(GenerationRequest(prompt="hi", **with_defaults({"temperature": 0})))
    result = model._scheduled(seq, prompt_tokens)
    assert seq.scores == [] and result.logprobs is None


def test_logprobs_alone_and_batched_agree(models):
    model = models["scheduler"]
    kw = with_defaults({"temperature": 0}, max_tokens=16, logprobs=3)
    alone = [scheduled(model, p, **kw) for p in PROMPTS]
    rng = random.Random(1)
    model.scheduler.most_rows = 0

    def staggered(i: int):
        time.sleep(rng.random() * 0.05)  # rows join while others run, at other cache lengths
        asks = kw if i % 3 else with_defaults({"temperature": 0}, max_tokens=16)  # some rows ask for nothing
        return scheduled(model, PROMPTS[i % len(PROMPTS)], **asks)

    with ThreadPoolExecutor(12) as pool:
        batched = list(pool.map(staggered, range(12)))
    assert model.scheduler.most_rows > 1
    for i, (ids, result) in enumerate(batched):
        alone_ids, alone_result = alone[i % len(PROMPTS)]
        assert ids == alone_ids
        if i % 3 == 0:
            assert result.logprobs is None
            continue
        for mine, theirs in zip(result.logprobs, alone_result.logprobs, strict=True):
            assert mine.token == theirs.token
            assert math.isclose(mine.logprob, theirs.logprob, abs_tol=TOLERANCE)
            assert [t.token for t in mine.top] == [t.token for t in theirs.top]
            assert [t.logprob for t in mine.top] == pytest.approx([t.logprob for t in theirs.top], abs=TOLERANCE)


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("stream", [False, True])
def test_generate_gives_the_schedulers_logprobs(models, settings, stream):
    prompt = PROMPTS[1]
    kw = with_defaults(settings, logprobs=2)
    ids, batched = scheduled(models["scheduler"], prompt, **kw)
    plain = models["generate"]
    request = GenerationRequest(prompt=prompt, stream=stream, **kw)
    choice = collect(request, plain.complete(request), plain.tokenizer)
    assert choice.text == batched.text
    check_against_reference(plain, prompt, ids, choice.logprobs, 2)


def test_a_stream_carries_the_logprobs_of_its_own_tokens(models):
    model = models["scheduler"]
    request = GenerationRequest(prompt="hello world", stream=True, **with_defaults({"temperature": 0}, logprobs=1))
    chunks = list(model.complete(request))
    whole = model.complete(GenerationRequest(prompt="hello world", **with_defaults({"temperature": 0}, logprobs=1)))
    assert all(c.logprobs is not None for c in chunks)
    assert [e.token for c in chunks for e in c.logprobs] == [e.token for e in whole.logprobs]
    text = scored = 0
    for chunk in chunks:  # a chunk's text comes with (or after) the tokens it is made of
        text += len(chunk.text)
        scored += sum(token_length(e) for e in chunk.logprobs)
        assert scored >= text


def test_a_stop_sequence_keeps_the_logprobs_of_the_text_it_leaves(models):
    model = models["scheduler"]
    kw = with_defaults({"temperature": 0}, max_tokens=12, logprobs=0)
    full = collect(GenerationRequest(prompt="hi", **kw), model.complete(GenerationRequest(prompt="hi", **kw)), None)
    tokens = [e.token for e in full.logprobs]
    if len(tokens) < 4 or any("bytes:" in t for t in tokens):
        pytest.skip("the random model's text is too short or splits characters")
    stop = tokens[2]  # the text is cut where the third token starts, or sooner
    for stream in (False, True):
        request = GenerationRequest(prompt="hi", stream=stream, stop=[stop], **kw)
        choice = collect(request, model.complete(request), model.tokenizer)
        assert choice.text == full.text[: full.text.index(stop)]
        kept = choice.logprobs
        assert [e.token for e in kept] == tokens[: len(kept)]
        starts = text_offsets(kept)
        assert all(start < len(choice.text) for start in starts)  # every kept token is in the text
        assert sum(token_length(e) for e in kept) >= len(choice.text)  # and the text is all theirs


# -- the openai client against a real server -------------------------------------------------


openai = pytest.importorskip("openai")


@pytest.fixture(scope="module", params=["worker", "process"])
def server(gpt_dir, request):
    """The model in the worker, and in a model host (``placement: process``: the logprobs cross to the worker)."""
    import shutil

    from servekit.testing import ServerProcess

    base = gpt_dir.parent / f"repo-{request.param}"
    shutil.copytree(gpt_dir, base / "gpt")
    if request.param == "process":
        (base / "gpt" / "servekit.yaml").write_text("placement: process\n")
    with ServerProcess(base, workers=1, env={"HF_HUB_OFFLINE": "1"}) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def hf(gpt_dir):
    """The test's own copy of the model and tokenizer, for the expected values."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(gpt_dir).eval(), AutoTokenizer.from_pretrained(gpt_dir)


def greedy(hf, prompt_ids: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
    """Greedy ids from the model's own logits, and the log_softmax of each step."""
    model, _ = hf
    ids = list(prompt_ids)
    rows = []
    with torch.inference_mode():
        for _ in range(steps):
            logprobs = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, -1].float(), dim=-1)
            rows.append(logprobs)
            ids.append(int(logprobs.argmax()))
    return ids[len(prompt_ids) :], torch.stack(rows)


def shown(tokenizer, token_id: int) -> str | None:
    """The token's text as the answer shows it, when it is whole characters."""
    text = tokenizer.decode([token_id])
    return None if "\ufffd" in text else text


def test_completions_logprobs_through_the_client(client, hf):
    _, tokenizer = hf
    prompt = "the quick brown"
    ids, expected = greedy(hf, tokenizer(prompt)["input_ids"], 8)
    result = client.completions.create(
        model="gpt", prompt=prompt, max_tokens=8, temperature=0, logprobs=3, extra_body={"ignore_eos": True}
    )
    lp = result.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == result.usage.completion_tokens == 8
    for step, token_id in enumerate(ids):
        assert lp.token_logprobs[step] == pytest.approx(float(expected[step, token_id]), abs=TOLERANCE)
        if shown(tokenizer, token_id) is not None:
            assert lp.tokens[step] == shown(tokenizer, token_id)
        top = lp.top_logprobs[step]
        assert list(top.values()) == sorted(top.values(), reverse=True)
        assert lp.tokens[step] in top and top[lp.tokens[step]] == max(top.values())  # greedy: the chosen is first
        values, _ = expected[step].topk(3)
        assert list(top.values()) == pytest.approx(values.tolist()[: len(top)], abs=TOLERANCE)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)

    streamed = client.completions.create(
        model="gpt",
        prompt=prompt,
        max_tokens=8,
        temperature=0,
        logprobs=3,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    pieces = [c.choices[0] for c in streamed if c.choices and c.choices[0].logprobs is not None]
    assert [t for p in pieces for t in p.logprobs.tokens] == lp.tokens
    assert [x for p in pieces for x in p.logprobs.token_logprobs] == pytest.approx(lp.token_logprobs, abs=TOLERANCE)
    assert [x for p in pieces for x in p.logprobs.text_offset] == lp.text_offset


def test_chat_logprobs_through_the_client(client, hf):
    _, tokenizer = hf
    messages = [{"role": "user", "content": "hello there"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids, expected = greedy(hf, tokenizer(prompt, add_special_tokens=False)["input_ids"], 6)
    ask = {"model": "gpt", "messages": messages, "max_tokens": 6, "temperature": 0, "extra_body": {"ignore_eos": True}}
    result = client.chat.completions.create(logprobs=True, top_logprobs=5, **ask)
    content = result.choices[0].logprobs.content
    assert len(content) == 6
    for step, (token_id, item) in enumerate(zip(ids, content)):
        assert item.logprob == pytest.approx(float(expected[step, token_id]), abs=TOLERANCE)
        if shown(tokenizer, token_id) is not None:
            assert item.token == shown(tokenizer, token_id)
            assert item.bytes == list(item.token.encode())
        assert len(item.top_logprobs) == 5
        assert [t.logprob for t in item.top_logprobs] == sorted((t.logprob for t in item.top_logprobs), reverse=True)
        assert item.top_logprobs[0].token == item.token  # greedy: the chosen token is the most likely
        values, _ = expected[step].topk(5)
        assert [t.logprob for t in item.top_logprobs] == pytest.approx(values.tolist(), abs=TOLERANCE)

    plain = client.chat.completions.create(logprobs=True, **ask)  # top_logprobs left out: none listed
    assert [c.top_logprobs for c in plain.choices[0].logprobs.content] == [[]] * 6
    assert client.chat.completions.create(**ask).choices[0].logprobs is None

    chunks = list(client.chat.completions.create(logprobs=True, top_logprobs=2, stream=True, **ask))
    carried = [c for c in chunks if c.choices and c.choices[0].logprobs is not None]
    assert carried and all(c.choices[0].delta.content for c in carried[:-1])  # text and its tokens go together
    streamed = [item for c in carried for item in c.choices[0].logprobs.content]
    assert [i.token for i in streamed] == [i.token for i in content]
    assert [i.logprob for i in streamed] == pytest.approx([i.logprob for i in content], abs=TOLERANCE)
    assert [len(i.top_logprobs) for i in streamed] == [2] * 6


def test_bad_logprobs_values_are_400s_through_the_client(client):
    messages = [{"role": "user", "content": "hi"}]
    cases = [
        lambda: client.completions.create(model="gpt", prompt="hi", logprobs=21),
        lambda: client.completions.create(model="gpt", prompt="hi", logprobs=2, echo=True, max_tokens=-1),
        lambda: client.chat.completions.create(model="gpt", messages=messages, logprobs=True, top_logprobs=21),
        lambda: client.chat.completions.create(model="gpt", messages=messages, top_logprobs=3),
    ]
    for case in cases:
        with pytest.raises(openai.BadRequestError) as info:
            case()
        assert info.value.status_code == 400


def test_a_token_id_prompt_scored_whole_and_streamed(client, hf):
    """Token ids and the prompt's scores cross from a model host as they come from the worker."""
    model, tokenizer = hf
    ids = tokenizer("the quick brown fox")["input_ids"]
    with torch.no_grad():
        expected = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
    wanted = [float(expected[j - 1, ids[j]]) for j in range(1, len(ids))]
    whole = client.completions.create(
        model="gpt", prompt=ids, echo=True, logprobs=1, max_tokens=0, extra_body={"prompt_logprobs": 1}
    ).choices[0]
    assert whole.text == "the quick brown fox" and whole.logprobs.token_logprobs[0] is None
    assert whole.logprobs.token_logprobs[1:] == pytest.approx(wanted, abs=TOLERANCE)
    assert [p[str(t)]["logprob"] for p, t in zip(whole.model_extra["prompt_logprobs"][1:], ids[1:])] == pytest.approx(
        wanted, abs=TOLERANCE
    )
    (first, *_) = [
        c
        for c in client.completions.create(model="gpt", prompt=ids, echo=True, logprobs=1, max_tokens=0, stream=True)
        if c.choices
    ]
    assert first.choices[0].logprobs.token_logprobs[1:] == pytest.approx(wanted, abs=TOLERANCE)
