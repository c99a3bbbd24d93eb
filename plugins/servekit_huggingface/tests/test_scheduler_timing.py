"""The continuous-batching scheduler's timing, in-process: each sequence reports where its time went
(waiting, prefill, decode) with its answer, and counts once in the engine's series: one inter-token
gap per token after its first, one queue/prefill/decode observation per sequence, a cancelled one
included; the running, waiting and KV-cache gauges under vLLM's names follow the batch.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from generative_models import build_tiny_gpt2, load_causal
from servekit.dataplane.generation import GenerationRequest

pytestmark = pytest.mark.slow  # imports torch
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def gpt_dir(tmp_path_factory):
    return build_tiny_gpt2(tmp_path_factory.mktemp("timing") / "gpt", n_positions=1024)


def sample(name: str, model: str) -> float:
    from prometheus_client import REGISTRY
    from servekit.observability import generation_metrics

    generation_metrics.flush()
    return REGISTRY.get_sample_value(name, {"model_name": model}) or 0.0


def wait_for(condition, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def request(max_tokens: int, stream: bool = False) -> GenerationRequest:
    return GenerationRequest(
        prompt="hello world", max_tokens=max_tokens, temperature=0, stream=stream, options={"ignore_eos": True}
    )


def test_each_sequence_reports_its_timing_and_counts_once(gpt_dir):
    model = load_causal(gpt_dir, name="timed", max_num_seqs=1)
    gaps = sample("vllm:inter_token_latency_seconds_count", "timed")
    queued = sample("vllm:request_queue_time_seconds_count", "timed")
    started = time.monotonic()
    with ThreadPoolExecutor(3) as pool:  # one place: two of them wait their turn
        results = list(pool.map(model.complete, [request(6), request(6), request(6)]))
    wall = time.monotonic() - started
    for result in results:
        timing = result.timing
        assert timing is not None and result.completion_tokens == 6
        assert min(timing.queue, timing.prefill, timing.decode) >= 0
        assert timing.queue + timing.prefill + timing.decode <= wall
    assert max(r.timing.queue for r in results) > 0  # someone waited for the one place
    assert sample("vllm:inter_token_latency_seconds_count", "timed") - gaps == 3 * 5
    assert sample("vllm:request_queue_time_seconds_count", "timed") - queued == 3
    assert sample("vllm:request_decode_time_seconds_count", "timed") >= 3
    model.close()


def test_a_stream_reports_its_timing_on_its_last_chunk_and_a_cancelled_one_still_counts(gpt_dir):
    model = load_causal(gpt_dir, name="timed-stream", max_num_seqs=4)
    chunks = list(model.complete(request(5, stream=True)))
    assert chunks[-1].timing is not None and chunks[-1].completion_tokens == 5
    assert all(chunk.timing is None for chunk in chunks[:-1])
    decoded = sample("vllm:request_decode_time_seconds_count", "timed-stream")
    stream = model.complete(request(900, stream=True))
    next(stream)
    assert sample("vllm:num_requests_running", "timed-stream") == 1
    stream.close()  # the client went away: the sequence leaves at the next step, counted
    wait_for(lambda: sample("vllm:request_decode_time_seconds_count", "timed-stream") == decoded + 1)
    wait_for(lambda: sample("vllm:num_requests_running", "timed-stream") == 0)
    assert sample("vllm:num_requests_waiting", "timed-stream") == 0
    model.close()
