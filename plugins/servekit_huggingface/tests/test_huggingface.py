"""The Hugging Face plugin in-process: recognising folders, generation (seeds,
sampling, stop sequences, context limits, streaming that stops when closed,
concurrency) and embeddings (pooling matching sentence-transformers, limits).

CUDA is not exercised here (CPU-only machines); ``device: cuda`` without CUDA
is checked to fail with a clear message.
"""

from __future__ import annotations

import json
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from generative_models import build_tiny_gpt2, minilm_folder
from servekit.dataplane.generation import GenerationRequest
from servekit.errors import BadRequest
from servekit.types import BatchingConfig, ModelConfig

# needs torch or TensorFlow (or TF Serving's protos, which import TensorFlow): out of the quick lane
pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")
from servekit_huggingface import loader


@pytest.fixture(scope="module")
def gpt_dir(tmp_path_factory) -> Path:
    return build_tiny_gpt2(tmp_path_factory.mktemp("gpt") / "gpt", n_positions=64)


@pytest.fixture(scope="module")
def gpt(gpt_dir):
    return loader.load_folder(gpt_dir, ModelConfig())


@pytest.fixture(scope="module")
def gpt_generate(gpt_dir):
    """The same model without continuous batching: one ``generate`` per request."""
    return loader.load_folder(gpt_dir, ModelConfig(options={"continuous_batching": False}))


@pytest.fixture(scope="module")
def minilm():
    return loader.load_folder(minilm_folder(), ModelConfig())


@pytest.fixture
def request_fixture(request):
    return request.getfixturevalue


def request(prompt="hello world", **kw) -> GenerationRequest:
    return GenerationRequest(prompt=prompt, **kw)


def generator_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "servekit-hf-generate"]


# -- recognising folders ---------------------------------------------------------------------


def test_other_folders_are_left_to_other_plugins(tmp_path):
    assert loader.load_folder(tmp_path, ModelConfig()) is None
    (tmp_path / "config.json").write_text(json.dumps({"hidden": 3}))  # not a transformers config
    assert loader.load_folder(tmp_path, ModelConfig()) is None
    assert loader.load_folder(tmp_path, ModelConfig(plugin="sklearn")) is None
    with pytest.raises(loader.LoadError, match="no config.json with a model_type"):
        loader.load_folder(tmp_path, ModelConfig(plugin="huggingface"))


def test_pickle_weights_and_missing_tokenizer_are_clear_errors(tmp_path, gpt_dir):
    (tmp_path / "config.json").write_text((gpt_dir / "config.json").read_text())
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(loader.LoadError, match="pytorch_model.bin: pickle weights are not loaded"):
        loader.load_folder(tmp_path, ModelConfig())
    shutil.copy(gpt_dir / "model.safetensors", tmp_path)
    with pytest.raises(loader.LoadError, match="no tokenizer files"):
        loader.load_folder(tmp_path, ModelConfig())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without CUDA")
def test_cuda_without_cuda_fails_clearly(gpt_dir):
    with pytest.raises(loader.LoadError, match="CUDA is not available"):
        loader.load_folder(gpt_dir, ModelConfig(device="cuda"))


def test_torch_threads_are_the_workers_share_of_the_cpus(gpt_dir, monkeypatch):
    """Workers each batching on all cores would spin against each other: a worker takes its share,
    a model host all but one, ``options.intra_op_threads`` what it says."""
    from servekit.hosts.runtime import ENV_IN_HOST
    from servekit.server.cpus import WORKERS_ENV, available_cpus

    before = torch.get_num_threads()
    try:
        monkeypatch.setenv(WORKERS_ENV, str(available_cpus() + 1))  # more workers than CPUs: one thread each
        loader.load_folder(gpt_dir, ModelConfig()).close()
        assert torch.get_num_threads() == 1
        monkeypatch.setenv(ENV_IN_HOST, "1")
        loader.load_folder(gpt_dir, ModelConfig()).close()
        assert torch.get_num_threads() == max(1, available_cpus() - 1)
        loader.load_folder(gpt_dir, ModelConfig(options={"intra_op_threads": 3})).close()
        assert torch.get_num_threads() == 3
        with pytest.raises(ValueError, match="intra_op_threads must be a positive integer"):
            loader.load_folder(gpt_dir, ModelConfig(options={"intra_op_threads": 0}))
    finally:
        torch.set_num_threads(before)


def test_an_encoders_torch_threads_are_the_workers_share_too(monkeypatch):
    """Two workers each running a merged embed batch must not run a thread per core each."""
    from servekit.server.cpus import WORKERS_ENV, available_cpus

    before = torch.get_num_threads()
    try:
        monkeypatch.setenv(WORKERS_ENV, str(available_cpus() + 1))
        batched = ModelConfig(batching=BatchingConfig(max_batch_size=64, max_batch_time_ms=1000))
        assert loader.load_folder(minilm_folder(), batched).embed(["a sentence"]).shape == (1, 384)
        assert torch.get_num_threads() == 1
        loader.load_folder(minilm_folder(), ModelConfig(options={"intra_op_threads": 2}))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_task_is_guessed_and_can_be_set(gpt, minilm, gpt_dir):
    assert type(gpt).__name__ == "CausalLM" and gpt.device == "cpu" and gpt.context == 64
    assert type(minilm).__name__ == "Encoder" and minilm.pooling == ["mean"] and minilm.max_length == 256
    as_encoder = loader.load_folder(gpt_dir, ModelConfig(options={"task": "embed"}))
    assert type(as_encoder).__name__ == "Encoder"
    with pytest.raises(loader.LoadError, match="options.task"):
        loader.load_folder(gpt_dir, ModelConfig(options={"task": "rank"}))


# -- generation ------------------------------------------------------------------------------


def test_greedy_result_counts_tokens(gpt):
    result = gpt.complete(request(max_tokens=7, temperature=0))
    assert result.prompt_tokens == len(gpt.tokenizer("hello world")["input_ids"])
    assert result.completion_tokens <= 7
    assert result.finish_reason in ("stop", "length")
    again = gpt.complete(request(max_tokens=7, temperature=0))
    assert again.text == result.text


def test_seeded_sampling_is_reproducible_under_concurrency(gpt):
    def sample(seed):
        return gpt.complete(request(max_tokens=20, temperature=1.0, seed=seed)).text

    with ThreadPoolExecutor(6) as pool:
        texts = list(pool.map(sample, [5, 6, 5, 6, 5, 6]))
    assert texts[0::2] == [texts[0]] * 3 and texts[1::2] == [texts[1]] * 3
    assert texts[0] != texts[1]


def test_tiny_top_p_is_greedy(gpt):
    greedy = gpt.complete(request(max_tokens=10, temperature=0)).text
    assert gpt.complete(request(max_tokens=10, temperature=1.0, top_p=1e-9, seed=3)).text == greedy
    assert gpt.complete(request(max_tokens=10, temperature=1.5, seed=3, options={"top_k": 1})).text == greedy


def test_stop_sequence_ends_generation_early(gpt):
    full = gpt.complete(request(max_tokens=30, temperature=0))
    if len(full.text) < 6:
        pytest.skip("the random model ended too early")
    stop = full.text[3:6]
    cut = gpt.complete(request(max_tokens=30, temperature=0, stop=[stop]))
    assert cut.completion_tokens < full.completion_tokens or full.completion_tokens <= 3
    assert stop in cut.text  # the plugin stops; the framework cuts the text exactly


def test_context_limits_and_unsupported_penalties(gpt):
    with pytest.raises(BadRequest, match="context"):
        gpt.complete(request(max_tokens=100))
    with pytest.raises(BadRequest, match="context holds 64"):
        gpt.complete(request(prompt="hello world " * 40))
    with pytest.raises(BadRequest, match="repetition_penalty"):
        gpt.complete(request(options={"presence_penalty": 0.5}))
    # no max_tokens: the rest of the context
    result = gpt.complete(request(prompt="hi", temperature=0, stop=[]))
    assert result.prompt_tokens + result.completion_tokens <= 64


@pytest.mark.parametrize("mode", ["gpt", "gpt_generate"])
def test_stream_matches_whole_text_and_reports_usage(mode, request_fixture):
    model = request_fixture(mode)
    for prompt in ("hello world", "hi", "the quick"):
        for options in ({"ignore_eos": True}, {}):
            whole = model.complete(request(prompt, max_tokens=30, temperature=1.0, seed=4, options=options))
            chunks = list(
                model.complete(request(prompt, max_tokens=30, temperature=1.0, seed=4, stream=True, options=options))
            )
            assert "".join(c.text for c in chunks) == whole.text
            assert chunks[-1].finish_reason == whole.finish_reason
            assert chunks[-1].completion_tokens == whole.completion_tokens
    assert not generator_threads()


def test_both_modes_give_the_same_text(gpt, gpt_generate):
    for kw in ({"temperature": 0}, {"temperature": 1.0, "seed": 9}, {"temperature": 0.7, "top_p": 0.9, "seed": 2}):
        for options in ({}, {"ignore_eos": True}, {"repetition_penalty": 1.3}):
            one = gpt.complete(request("hello world", max_tokens=20, options=options, **kw))
            other = gpt_generate.complete(request("hello world", max_tokens=20, options=options, **kw))
            assert (one.text, one.finish_reason, one.completion_tokens) == (
                other.text,
                other.finish_reason,
                other.completion_tokens,
            )


def test_ignore_eos_generates_max_tokens(gpt, gpt_generate):
    for model in (gpt, gpt_generate):
        result = model.complete(request("hello", max_tokens=40, temperature=1.0, seed=0, options={"ignore_eos": True}))
        assert (result.completion_tokens, result.finish_reason) == (40, "length")
    with pytest.raises(BadRequest, match="ignore_eos"):
        gpt.complete(request(options={"ignore_eos": "yes"}))


def test_closing_a_stream_stops_the_generate_thread(gpt_generate):
    gpt = gpt_generate
    stream = gpt.complete(request(prompt="a", max_tokens=60, temperature=1.0, seed=1, stream=True))
    got = [next(stream), next(stream)]
    assert len(generator_threads()) == 1
    stream.close()  # what the server does when the client disconnects
    assert not generator_threads()
    assert all(c.text for c in got)


def test_max_concurrent_generations_still_serves_everyone(gpt_dir):
    options = {"max_concurrent_generations": 1, "continuous_batching": False}
    limited = loader.load_folder(gpt_dir, ModelConfig(options=options))
    with ThreadPoolExecutor(4) as pool:
        texts = list(pool.map(lambda _: limited.complete(request(max_tokens=5, temperature=0)).text, range(4)))
    assert len(set(texts)) == 1
    with pytest.raises(ValueError, match="max_concurrent_generations"):
        loader.load_folder(gpt_dir, ModelConfig(options={"max_concurrent_generations": 0}))


def test_attributions_cover_every_prompt_token(gpt):
    out = gpt.attributions("hello world")
    assert len(out["tokens"]) == len(out["attributions"]) == len(gpt.tokenizer("hello world")["input_ids"])
    assert all(p.grad is None for p in gpt.model.parameters())  # no gradient left on the weights


# -- embeddings ------------------------------------------------------------------------------


def test_minilm_matches_sentence_transformers(minilm):
    st = pytest.importorskip("sentence_transformers")
    sentences = ["A man is eating food.", "The stock market fell today."]
    expected = st.SentenceTransformer(str(minilm_folder()), device="cpu").encode(sentences)
    got = minilm.embed(sentences)
    assert got.shape == (2, 384)
    assert np.allclose(got, expected, atol=1e-5)


def test_too_long_input_is_refused_unless_truncation_is_on(minilm):
    with pytest.raises(BadRequest, match="at most 256"):
        minilm.embed(["word " * 400])
    truncating = loader.load_folder(minilm_folder(), ModelConfig(options={"truncate": True}))
    assert truncating.embed(["word " * 400]).shape == (1, 384)


def test_batches_give_the_same_vectors(minilm):
    texts = [f"sentence number {i}" for i in range(5)]
    minilm.batch_size = 2
    try:
        batched = minilm.embed(texts)
    finally:
        minilm.batch_size = 32
    assert np.allclose(batched, minilm.embed(texts), atol=1e-5)


# -- through the app -------------------------------------------------------------------------


def test_completion_with_explain_through_the_app(gpt_dir):
    from servekit.server.app import create_app
    from servekit.server.settings import Settings

    app = create_app(Settings(paths=[str(gpt_dir)], poll_interval=0), start=False)
    app.extensions["servekit"].repository.load_now()
    r = app.test_client().post(
        "/completions", json={"prompt": ["hello world"], "explain": True, "max_tokens": 3}, buffered=True
    )
    assert r.status_code == 200, r.json
    (explanation,) = r.json["explanations"]
    assert len(explanation["tokens"]) == len(explanation["attributions"])
    assert isinstance(explanation["target"], str)


@pytest.mark.slow  # seconds: concurrent MiniLM passes
def test_concurrent_embeddings_requests_share_forward_passes(tmp_path):
    from servekit.server.app import create_app
    from servekit.server.settings import Settings

    (tmp_path / "minilm").symlink_to(minilm_folder(), target_is_directory=True)
    app = create_app(
        Settings(paths=[str(tmp_path / "minilm")], poll_interval=0, max_batch_size=64, max_batch_time_ms=50),
        start=False,
    )
    app.extensions["servekit"].repository.load_now()
    client = app.test_client()
    texts = [f"sentence number {i} " + "word " * (i % 7) for i in range(24)]
    alone = [client.post("/v1/embeddings", json={"input": t, "encoding_format": "float"}).json for t in texts]
    ids = loader.load_folder(minilm_folder(), ModelConfig()).tokenizer("a sentence sent as ids")["input_ids"]
    as_ids = client.post("/v1/embeddings", json={"input": ids, "encoding_format": "float"}).json
    barrier = threading.Barrier(len(texts) + 1)

    def embed(body):
        barrier.wait()
        return client.post("/v1/embeddings", json={**body, "encoding_format": "float"}).json

    calls_before, texts_before = _embed_batches(client)
    with ThreadPoolExecutor(len(texts) + 1) as pool:
        together = list(pool.map(embed, [{"input": t} for t in texts] + [{"input": ids}]))
    mv = app.extensions["servekit"].repository.resolve("minilm")
    assert mv.batcher.stats.largest > 1  # requests were merged
    calls, embedded = _embed_batches(client)  # the batch-size histogram counts embed calls, merged ones as one
    assert embedded - texts_before == len(texts) + 1
    assert calls - calls_before == mv.batcher.stats.calls + (len(texts) + 1 - mv.batcher.stats.requests)
    assert calls - calls_before < len(texts) + 1
    for one, other in zip([*alone, as_ids], together):
        assert np.allclose(one["data"][0]["embedding"], other["data"][0]["embedding"], atol=1e-5)
        assert one["usage"] == other["usage"]
    too_long = client.post("/v1/embeddings", json={"input": "word " * 400})
    assert too_long.status_code == 400 and "at most 256" in too_long.json["error"]["message"]


def _embed_batches(client) -> tuple[float, float]:
    """``servekit_batch_size{model="minilm"}``'s count and sum: embed calls and the texts in them."""
    from prometheus_client.parser import text_string_to_metric_families

    found = {"servekit_batch_size_count": 0.0, "servekit_batch_size_sum": 0.0}
    for family in text_string_to_metric_families(client.get("/metrics").get_data(as_text=True)):
        for sample in family.samples:
            if sample.name in found and sample.labels.get("model") == "minilm":
                found[sample.name] += sample.value
    return found["servekit_batch_size_count"], found["servekit_batch_size_sum"]


def test_streamed_text_joins_the_same_however_the_ids_arrive(gpt_dir):
    """Bytes that do not (yet) make a character: the pieces join to the whole answer's text,
    whether the scheduler hands the stream one id at a time or several together."""
    from servekit_huggingface.causal import IncrementalText
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gpt_dir)
    symbol = _byte_symbols()
    raw = b"\\" + b"\x82\x98\xa7\xe2\xd2\xa7\xd2A\x98\x80\xe2\xf0" + b"quco"  # stray and split UTF-8 bytes
    ids = tokenizer.convert_tokens_to_ids([symbol[b] for b in raw])
    whole = IncrementalText.joined(tokenizer, ids)
    for size in (1, 2, 3, 5, len(ids)):
        text = IncrementalText(tokenizer)
        pieces = [text.add(ids[i : i + size]) for i in range(0, len(ids), size)]
        assert "".join(pieces) + text.rest() == whole, size
    assert whole.startswith("\\") and whole.endswith("quco")


def _byte_symbols() -> dict[int, str]:
    """Byte-level BPE's printable stand-in for each byte (GPT-2's table)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols = {b: chr(b) for b in kept}
    extra = 0
    for b in range(256):
        if b not in symbols:
            symbols[b] = chr(256 + extra)
            extra += 1
    return symbols
