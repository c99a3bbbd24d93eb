"""Continuous batching of the Hugging Face plugin, in-process: answers independent of
the batch (greedy and seeded sampling, GPT-2 and Llama-style models, sequences
joining mid-flight), the limits and the queue, cancellation freeing a slot,
unloading, and the gauges ``/metrics`` reads.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from generative_models import build_tiny_gpt2, load_causal
from servekit.dataplane.generation import GenerationRequest
from servekit.errors import NotReady, TooManyRequests

# needs torch or TensorFlow (or TF Serving's protos, which import TensorFlow): out of the quick lane
pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")

PROMPTS = ["hello world", "the quick brown fox jumps over", "hi", "servekit serves models over many protocols", "a b"]


def tokens(model, prompt: str, **kw) -> list[int]:
    """The ids the scheduler generated for one request (read from its sequence)."""
    seq, prompt_tokens = model._sequence(GenerationRequest(prompt=prompt, **kw))
    result = model._scheduled(seq, prompt_tokens)
    assert result.completion_tokens == len(seq.tokens)
    return seq.tokens


def wait_for(condition, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


SETTINGS = [
    pytest.param({"temperature": 0}, id="greedy"),
    pytest.param({"temperature": 0, "options": {"repetition_penalty": 1.5}}, id="greedy-penalty"),
    pytest.param({"temperature": 1.0, "seed": 11}, id="seeded"),
    pytest.param({"temperature": 0.8, "top_p": 0.9, "seed": 3, "options": {"top_k": 40}}, id="seeded-top"),
]


@pytest.fixture(scope="module")
def loaded(request):
    """One model per folder fixture for the module, closed at its end."""
    models: dict[str, object] = {}

    def get(kind: str):
        if kind not in models:
            models[kind] = load_causal(request.getfixturevalue(kind))
        return models[kind]

    yield get
    for model in models.values():
        model.close()


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("kind", ["tiny_gpt2", "tiny_llama"])
def test_the_same_tokens_alone_and_batched(kind, settings, loaded):
    model = loaded(kind)
    kw = {"max_tokens": 24, **settings, "options": {"ignore_eos": True, **settings.get("options", {})}}
    model.scheduler.most_rows = 0
    alone = [tokens(model, p, **kw) for p in PROMPTS]
    assert model.scheduler.most_rows == 1
    rng = random.Random(0)

    def staggered(i: int) -> list[int]:
        time.sleep(rng.random() * 0.05)  # rows join while others are running, with other cache lengths
        return tokens(model, PROMPTS[i % len(PROMPTS)], **kw)

    with ThreadPoolExecutor(15) as pool:
        batched = list(pool.map(staggered, range(15)))
    assert model.scheduler.most_rows > 1  # they did share steps
    assert batched == [alone[i % len(PROMPTS)] for i in range(15)]


@pytest.mark.parametrize("kind", ["tiny_gpt2", "tiny_llama"])
def test_prompts_of_one_length_arriving_together_share_one_prefill(kind, loaded):
    model = loaded(kind)
    kw = {"max_tokens": 12, "options": {"ignore_eos": True}}
    settings = [s.values[0] for s in SETTINGS]
    prompts = ["hello world", "the quick brown fox jumps over", "hi"]
    lengths = {len(model.tokenizer(p)["input_ids"]) for p in prompts}
    asks = [(p, s) for p in prompts for s in settings]
    alone = [tokens(model, p, **{**kw, **s, "options": {**kw["options"], **s.get("options", {})}}) for p, s in asks]
    scheduler = model.scheduler
    sequences = []
    before = scheduler.prefills
    with scheduler.lock:  # the scheduler's thread waits: every request is there at its next step
        for p, s in asks:
            seq, _ = model._sequence(
                GenerationRequest(prompt=p, **{**kw, **s, "options": {**kw["options"], **s.get("options", {})}})
            )
            scheduler.submit(seq)
            sequences.append(seq)
    for seq in sequences:
        for _ in seq.tokens_as_produced(scheduler.alive):
            pass
    assert scheduler.prefills - before == len(lengths)  # one forward pass per prompt length
    assert [seq.tokens for seq in sequences] == alone


def test_the_same_tokens_as_generate(tiny_llama):
    batched, generating = load_causal(tiny_llama), load_causal(tiny_llama, continuous_batching=False)
    for prompt in PROMPTS:
        for kw in ({"temperature": 0}, {"temperature": 1.0, "seed": 5}):
            one = batched.complete(GenerationRequest(prompt=prompt, max_tokens=16, **kw))
            other = generating.complete(GenerationRequest(prompt=prompt, max_tokens=16, **kw))
            assert (one.text, one.completion_tokens, one.finish_reason) == (
                other.text,
                other.completion_tokens,
                other.finish_reason,
            )
    batched.close()


def test_max_num_seqs_bounds_the_batch_and_everyone_is_served(tiny_gpt2):
    model = load_causal(tiny_gpt2, max_num_seqs=3)
    with ThreadPoolExecutor(8) as pool:
        texts = list(
            pool.map(
                lambda _: (
                    model.complete(
                        GenerationRequest(prompt="hello", max_tokens=10, temperature=0, options={"ignore_eos": True})
                    ).text
                ),
                range(8),
            )
        )
    assert len(set(texts)) == 1
    assert model.scheduler.most_rows == 3
    model.close()


def test_max_batched_tokens_spreads_prefills_over_steps(tiny_gpt2):
    model = load_causal(tiny_gpt2, max_batched_tokens=8)
    long_prompt = "the quick brown fox jumps over the lazy dog"
    assert len(model.tokenizer(long_prompt)["input_ids"]) > 8
    alone = tokens(model, long_prompt, max_tokens=6, temperature=0)  # over the budget: prefilled on its own step
    with ThreadPoolExecutor(4) as pool:
        batched = list(pool.map(lambda _: tokens(model, long_prompt, max_tokens=6, temperature=0), range(4)))
    assert batched == [alone] * 4
    model.close()


@pytest.fixture(scope="module")
def long_gpt_dir(tmp_path_factory) -> Path:
    """A context long enough that a stream runs for thousands of steps unless it is cancelled."""
    return build_tiny_gpt2(tmp_path_factory.mktemp("long") / "gpt", n_positions=4096)


def open_stream(model, max_tokens: int = 100, **kw):
    stream = model.complete(
        GenerationRequest(prompt="hello", max_tokens=max_tokens, temperature=1.0, seed=1, stream=True, **kw)
    )
    first = next(stream)
    return stream, first


def test_cancelling_a_stream_frees_its_slot_at_the_next_step(long_gpt_dir):
    from prometheus_client import REGISTRY

    model = load_causal(long_gpt_dir, name="cancel-me", max_num_seqs=1)
    labels = {"model": "cancel-me", "version": "1"}
    stream, first = open_stream(model, max_tokens=4000, options={"ignore_eos": True})
    assert first.text or first.completion_tokens
    assert model.scheduler.running == 1
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(
            model.complete, GenerationRequest(prompt="hi", max_tokens=5, temperature=0, options={"ignore_eos": True})
        )
        wait_for(lambda: model.scheduler.queued == 1)
        assert REGISTRY.get_sample_value("servekit_generation_queue_depth", labels) == 1
        assert REGISTRY.get_sample_value("servekit_generation_running", labels) == 1
        time.sleep(0.2)
        assert not waiting.done()  # the batch is full
        stream.close()  # what the server does when the client disconnects
        result = waiting.result(timeout=20)  # starts as soon as the slot is free
    assert (result.completion_tokens, result.finish_reason) == (5, "length")
    assert model.scheduler.steps < 3900  # the cancelled stream did not run to its end
    wait_for(lambda: model.scheduler.running == 0)
    wait_for(lambda: REGISTRY.get_sample_value("servekit_generation_running", labels) == 0)
    assert REGISTRY.get_sample_value("servekit_generation_queue_depth", labels) == 0
    model.close()


def test_tokens_ready_together_go_out_as_one_chunk_that_joins_the_same(long_gpt_dir):
    """A stream whose reader falls behind gets every ready token in one chunk (none held back
    while reading keeps up), and the chunks join to the whole answer's text."""
    model = load_causal(long_gpt_dir)
    ask = {"prompt": "hello", "max_tokens": 60, "temperature": 1.0, "seed": 4, "options": {"ignore_eos": True}}
    whole = model.complete(GenerationRequest(**ask))
    stream = model.complete(GenerationRequest(**ask, stream=True))
    pieces = [next(stream)]
    wait_for(lambda: model.scheduler.running == 0)  # every token is produced while nobody reads
    pieces += list(stream)
    texts = [p.text for p in pieces if p.text]
    assert len(texts) <= 3  # the first piece, then the rest at once (a final flush at most)
    assert "".join(p.text for p in pieces) == whole.text
    assert pieces[-1].completion_tokens == whole.completion_tokens == 60
    model.close()


def test_a_full_queue_refuses_with_429(long_gpt_dir):
    model = load_causal(long_gpt_dir, max_num_seqs=1, max_queued=1)
    stream, _ = open_stream(model, max_tokens=4000, options={"ignore_eos": True})
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(model.complete, GenerationRequest(prompt="hi", max_tokens=3, temperature=0))
        wait_for(lambda: model.scheduler.queued == 1)
        with pytest.raises(TooManyRequests, match="max_queued: 1"):
            model.complete(GenerationRequest(prompt="hi", max_tokens=3, temperature=0))
        stream.close()
        assert waiting.result(timeout=20).completion_tokens >= 1
    model.close()


def test_a_stop_sequence_ends_the_sequence_in_the_batch(tiny_gpt2):
    model = load_causal(tiny_gpt2)
    full = model.complete(GenerationRequest(prompt="hello", max_tokens=30, temperature=0, options={"ignore_eos": True}))
    stop = full.text[4:7]
    cut = model.complete(
        GenerationRequest(prompt="hello", max_tokens=30, temperature=0, stop=[stop], options={"ignore_eos": True})
    )
    assert cut.finish_reason == "stop" and cut.completion_tokens < 30
    assert stop in cut.text  # the plugin stops; the framework cuts the text exactly
    model.close()


def test_unloading_ends_running_and_waiting_requests_with_a_clear_error(long_gpt_dir):
    model = load_causal(long_gpt_dir, max_num_seqs=1)
    stream, _ = open_stream(model, max_tokens=4000, options={"ignore_eos": True})
    errors: list[BaseException] = []

    def wait_in_queue() -> None:
        try:
            model.complete(GenerationRequest(prompt="hi", max_tokens=3, temperature=0))
        except NotReady as exc:
            errors.append(exc)

    thread = threading.Thread(target=wait_in_queue)
    thread.start()
    wait_for(lambda: model.scheduler.queued == 1)
    model.close()
    thread.join(timeout=20)
    assert errors and "unloaded" in str(errors[0])
    with pytest.raises(NotReady, match="unloaded"):
        list(stream)
    with pytest.raises(NotReady, match="unloaded"):
        model.complete(GenerationRequest(prompt="hi", max_tokens=3))
    assert not model.scheduler.alive()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"continuous_batching": "yes"}, "continuous_batching must be true or false"),
        ({"max_num_seqs": 0}, "max_num_seqs must be a positive integer"),
        ({"max_batched_tokens": 1.5}, "max_batched_tokens must be a positive integer"),
        ({"max_queued": -1}, "max_queued must be a non-negative integer"),
    ],
)
def test_bad_scheduler_options_are_refused_at_load(tiny_gpt2, options, message):
    with pytest.raises(ValueError, match=message):
        load_causal(tiny_gpt2, **options)


def test_an_empty_prompt_starts_from_the_start_of_text_token(tiny_gpt2):
    model = load_causal(tiny_gpt2)
    result = model.complete(GenerationRequest(prompt="", max_tokens=5, temperature=0, options={"ignore_eos": True}))
    assert (result.prompt_tokens, result.completion_tokens) == (1, 5)
    model.close()


def test_the_roomy_cache_holds_what_concatenation_would_without_copying_each_step():
    from servekit_huggingface.kv_cache import RoomyLayer

    gen = torch.Generator().manual_seed(0)
    layer, keys, values = RoomyLayer(), None, None
    buffers = set()
    for step in range(150):
        k, v = (torch.randn((3, 2, 1 if step else 7, 4), generator=gen) for _ in range(2))
        if step == 90:  # the scheduler replaces the tensors (a row left): the layer moves, and still agrees
            layer.keys, layer.values = layer.keys[[0, 2]], layer.values[[0, 2]]
            keys, values = keys[[0, 2]], values[[0, 2]]
        if step >= 90:
            k, v = k[:2], v[:2]
        got_k, got_v = layer.update(k, v)
        keys = k if keys is None else torch.cat([keys, k], dim=-2)
        values = v if values is None else torch.cat([values, v], dim=-2)
        assert torch.equal(got_k, keys) and torch.equal(got_v, values)
        assert layer.get_seq_length() == keys.shape[-2]
        buffers.add(layer.room[0].data_ptr())
    assert len(buffers) <= 4  # moved when full (7 -> 14+64 -> ...) and once after the rows changed
