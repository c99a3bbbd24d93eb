"""The signals LLM routers and autoscalers read, through a real Prometheus scraping a two-worker
server of a tiny causal LM: the generation histograms and counters under servekit's and vLLM's
names, with counts that match the requests sent, and the running/waiting/KV-cache gauges rising
under load and falling to zero.

No durations are asserted: counts, token totals and the buckets' consistency only.
"""

from __future__ import annotations

import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from generative_models import build_tiny_gpt2
from prometheus_server import Prometheus, binary
from servekit.observability import generation_metrics
from servekit.testing import ServerProcess

pytestmark = pytest.mark.slow  # starts a server and Prometheus

MODEL = "gpt"
#: the same weights in a model host fed by both workers (``placement: process``): one batch of two places
HOSTED = "gpt-host"
MAX_TOKENS = 40
STREAMED = 6
WHOLE = 6
SENT = STREAMED + WHOLE


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """Two workers, each with a batch of two places for MODEL, both feeding one host's batch of two
    for HOSTED (so twelve requests at once make some wait), and Prometheus scraping every half second."""
    binary("prometheus")
    base = tmp_path_factory.mktemp("signals")
    folder = build_tiny_gpt2(base / "repo" / MODEL)
    (folder / "servekit.yaml").write_text("options: {max_num_seqs: 2}\n")
    hosted = build_tiny_gpt2(base / "repo" / HOSTED)
    (hosted / "servekit.yaml").write_text("placement: process\noptions: {max_num_seqs: 2}\n")
    with ServerProcess(base / "repo", workers=2, threads=8, env={"HF_HUB_OFFLINE": "1"}) as server:
        config = {
            "global": {"scrape_interval": "500ms", "evaluation_interval": "1s"},
            "scrape_configs": [
                {"job_name": "servekit", "static_configs": [{"targets": [f"127.0.0.1:{server.http_port}"]}]}
            ],
        }
        (base / "prometheus.yml").write_text(json.dumps(config))
        prometheus = Prometheus(base, base / "prometheus.yml")
        try:
            yield server, prometheus
        finally:
            prometheus.stop()


def scraped(server) -> str:
    return requests.get(server.url + "/metrics", timeout=10).text


def value(text: str, name: str, model: str = MODEL) -> float:
    """The sum of a series' samples for the model (0 when absent)."""
    found = re.findall(rf'^{re.escape(name)}\{{[^}}]*model_name="{model}"[^}}]*\}} (\S+)$', text, re.M)
    return sum(float(v) for v in found)


def _complete(server, model: str, stream: bool) -> dict:
    """One completion of exactly MAX_TOKENS tokens; its usage."""
    body = {
        "model": model,
        "prompt": "hello world, the quick brown fox",
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    }
    r = requests.post(server.url + "/v1/completions", json=body, timeout=120, stream=stream)
    assert r.status_code == 200, r.text
    if not stream:
        return r.json()["usage"]
    usage = None
    for line in r.iter_lines():
        if line.startswith(b"data: {"):
            usage = json.loads(line[6:]).get("usage") or usage
    assert usage is not None
    return usage


class Highest:
    """Reads /metrics in the background while the load runs and keeps each gauge's highest value."""

    NAMES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")

    def __init__(self, server, model: str):
        self.server, self.model = server, model
        self.highest = dict.fromkeys(self.NAMES, 0.0)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with requests.Session() as session:
            while not self.done.is_set():
                text = session.get(self.server.url + "/metrics", timeout=10).text
                for name in self.NAMES:
                    self.highest[name] = max(self.highest[name], value(text, name, self.model))

    def stop(self) -> dict[str, float]:
        self.done.set()
        self.thread.join(30)
        return self.highest


def _wait_for(check, what: str, seconds: float = 60):
    deadline = time.monotonic() + seconds
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not seen within {seconds} s"
        time.sleep(0.2)


HISTOGRAMS = {  # servekit's name -> vLLM's names, and how many observations each request makes
    "servekit_generation_time_to_first_token_seconds": (["vllm:time_to_first_token_seconds"], 1),
    "servekit_generation_e2e_seconds": (["vllm:e2e_request_latency_seconds"], 1),
    "servekit_generation_queue_seconds": (["vllm:request_queue_time_seconds"], 1),
    "servekit_generation_prefill_seconds": (["vllm:request_prefill_time_seconds"], 1),
    "servekit_generation_decode_seconds": (["vllm:request_decode_time_seconds"], 1),
    "servekit_generation_inference_seconds": (["vllm:request_inference_time_seconds"], 1),
    "servekit_generation_time_per_output_token_seconds": (["vllm:request_time_per_output_token_seconds"], 1),
    "servekit_generation_inter_token_seconds": (
        ["vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"],
        MAX_TOKENS - 1,  # one per token after the first
    ),
}
VLLM_BOUNDS = {
    "vllm:time_to_first_token_seconds": generation_metrics.VLLM_TTFT_BUCKETS,
    "vllm:inter_token_latency_seconds": generation_metrics.VLLM_TOKEN_BUCKETS,
    "vllm:e2e_request_latency_seconds": generation_metrics.VLLM_REQUEST_BUCKETS,
    "vllm:request_queue_time_seconds": generation_metrics.VLLM_REQUEST_BUCKETS,
}


@pytest.mark.parametrize("model", [MODEL, HOSTED], ids=["batch-per-worker", "model-host"])
def test_prometheus_sees_every_generation_under_both_names_and_the_gauges_rise_and_fall(stack, model):
    server, prometheus = stack
    watcher = Highest(server, model)
    try:
        with ThreadPoolExecutor(SENT) as pool:
            usages = list(
                pool.map(lambda stream: _complete(server, model, stream), [True] * STREAMED + [False] * WHOLE)
            )
    finally:
        highest = watcher.stop()
    # four places (two per worker) or two (one host) and twelve requests at once: some ran, some waited
    assert highest["vllm:num_requests_running"] >= 1, highest
    assert highest["vllm:num_requests_waiting"] >= 1, highest
    assert 0 < highest["vllm:kv_cache_usage_perc"] <= 1, highest
    prompt_tokens = sum(u["prompt_tokens"] for u in usages)
    assert all(u["completion_tokens"] == MAX_TOKENS for u in usages)

    def query(expr: str) -> float:
        result = prometheus.query(expr)
        return float(result[0]["value"][1]) if result else -1.0

    # Prometheus's last scrape holds every request (each worker's sums reach the shared values in the background)
    _wait_for(
        lambda: (
            query(f'sum(vllm:e2e_request_latency_seconds_count{{model_name="{model}"}})') == SENT
            and query(f'sum(vllm:inter_token_latency_seconds_count{{model_name="{model}"}})') == SENT * (MAX_TOKENS - 1)
        ),
        "every request in Prometheus",
    )
    # and the gauges fell back to zero, in Prometheus as on /metrics
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        _wait_for(lambda name=name: query(f'sum({name}{{model_name="{model}"}})') == 0, f"{name} at 0")
    for name in ("servekit_generation_running", "servekit_generation_queue_depth"):
        assert query(f'sum({name}{{model="{model}"}})') == 0, name
    assert query(f'servekit_generation_kv_cache_usage_ratio{{model="{model}"}}') == 0
    assert query(f'vllm:gpu_cache_usage_perc{{model_name="{model}"}}') == 0  # the older name, still read

    for ours, (theirs, per_request) in HISTOGRAMS.items():
        expected = SENT * per_request
        assert query(f'sum({ours}_count{{model="{model}"}})') == expected, ours
        total = query(f'sum({ours}_sum{{model="{model}"}})')
        for name in theirs:
            assert query(f'sum({name}_count{{model_name="{model}"}})') == expected, name
            # the same observations: the same sum, whatever the buckets
            assert query(f'sum({name}_sum{{model_name="{model}"}})') == pytest.approx(total), name
        for name, label in [(ours, "model"), *((n, "model_name") for n in theirs)]:
            buckets = prometheus.query(f'sum by (le) ({name}_bucket{{{label}="{model}"}})')
            counts = sorted((float(b["metric"]["le"]), float(b["value"][1])) for b in buckets)
            assert counts[-1] == (float("inf"), expected), name  # +Inf holds every observation
            assert all(a[1] <= b[1] for a, b in zip(counts, counts[1:])), name  # cumulative
            if name in VLLM_BOUNDS:
                assert [le for le, _ in counts[:-1]] == list(VLLM_BOUNDS[name]), name  # vLLM's own bounds

    # the token counters and the finish reasons, under both names
    assert query(f'sum(vllm:prompt_tokens_total{{model_name="{model}"}})') == prompt_tokens
    assert query(f'sum(servekit_generation_prompt_tokens_total{{model="{model}"}})') == prompt_tokens
    assert query(f'sum(vllm:generation_tokens_total{{model_name="{model}"}})') == SENT * MAX_TOKENS
    assert query(f'sum(servekit_generation_completion_tokens_total{{model="{model}"}})') == SENT * MAX_TOKENS
    assert query(f'vllm:request_success_total{{model_name="{model}",finished_reason="length"}}') == SENT
    assert query(f'servekit_generation_requests_total{{model="{model}",finish_reason="length"}}') == SENT
    assert query(f'sum(vllm:request_generation_tokens_sum{{model_name="{model}"}})') == SENT * MAX_TOKENS
    # every prompt was looked up in the prefix cache, under both names
    looked_up = query(f'sum(vllm:prefix_cache_queries_total{{model_name="{model}"}})')
    assert looked_up == prompt_tokens
    assert query(f'sum(servekit_prefix_cache_queries_total{{model="{model}"}})') == looked_up
    # the model's own label on servekit's names, vLLM's on theirs: no vLLM series carries 'model'
    assert not prometheus.query('{__name__=~"vllm:.*", model!=""}')


def test_a_whole_answer_carries_tgi_timing_headers_and_a_stream_none(stack):
    server, _ = stack
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 5, "temperature": 0, "ignore_eos": True}
    r = requests.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert r.headers["x-prompt-tokens"] == str(usage["prompt_tokens"])
    assert r.headers["x-generated-tokens"] == "5"
    for name in ("x-total-time", "x-queue-time", "x-inference-time", "x-time-per-token"):
        assert r.headers[name].isdigit(), name  # whole milliseconds, as TGI writes them
    assert int(r.headers["x-inference-time"]) <= int(r.headers["x-total-time"])
    streamed = requests.post(server.url + "/v1/completions", json={**body, "stream": True}, timeout=60)
    assert streamed.status_code == 200
    streamed.content  # noqa: B018 - read to its end
    assert "x-total-time" not in streamed.headers  # the headers left before the first token


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_openai_client_reads_the_timing_in_usage(stack, stream):
    """Groq's OpenAI API puts seconds in ``usage`` (queue_time, prompt_time, completion_time,
    total_time); the ``openai`` client keeps them as extra fields, whole or in a stream's last chunk."""
    openai = pytest.importorskip("openai")
    server, _ = stack
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    asked = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 5,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }
    if stream:
        chunks = list(client.chat.completions.create(**asked, stream=True, stream_options={"include_usage": True}))
        usage = chunks[-1].usage
    else:
        usage = client.chat.completions.create(**asked).usage
    assert usage is not None and usage.completion_tokens == 5
    times = usage.model_extra
    assert set(times) == {"queue_time", "prompt_time", "completion_time", "total_time"}
    assert all(isinstance(v, float) and v >= 0 for v in times.values()), times
    assert times["total_time"] == pytest.approx(times["prompt_time"] + times["completion_time"], abs=2e-6)


def finished(text: str, reason: str) -> float:
    """vLLM's count of the model's generations that ended for ``reason``."""
    pattern = rf'^vllm:request_success_total\{{(?=[^}}]*finished_reason="{reason}")(?=[^}}]*model_name="{MODEL}")[^}}]*\}} (\S+)$'
    return sum(float(v) for v in re.findall(pattern, text, re.M))


def test_a_stream_the_client_leaves_counts_as_aborted(stack):
    server, _ = stack
    before = finished(scraped(server), "abort")
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 200, "temperature": 0, "ignore_eos": True, "stream": True}
    with requests.post(server.url + "/v1/completions", json=body, timeout=60, stream=True) as r:
        assert r.status_code == 200
        next(r.iter_lines())  # the first event, then the client leaves
    _wait_for(lambda: finished(scraped(server), "abort") > before, "the left stream counted as aborted")
    assert finished(scraped(server), "abort") == before + 1
