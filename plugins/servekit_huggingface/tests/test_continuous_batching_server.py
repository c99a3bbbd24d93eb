"""Continuous batching through a real ``servekit serve``: two HTTP workers feeding one
model host (``placement: process``), the ``openai`` client and LangChain streaming
64 chats at once, a client that disconnects mid-stream leaving the batch, two host
replicas each running a batch, and the gauges on ``/metrics``.
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

pytestmark = pytest.mark.slow  # starts real servers

openai = pytest.importorskip("openai")

STREAMS = 64
MESSAGES = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def gpt_folder(tmp_path_factory):
    base = tmp_path_factory.mktemp("cb-repo")
    folder = build_tiny_gpt2(base / "gpt")
    (folder / "servekit.yaml").write_text("placement: process\noptions: {max_num_seqs: 64}\n")
    # the same weights in two model hosts, each batch capped at four sequences
    replicated = build_tiny_gpt2(base / "gpt-replicas")
    (replicated / "servekit.yaml").write_text("placement: process\nreplicas: 2\noptions: {max_num_seqs: 4}\n")
    return folder


@pytest.fixture(scope="module")
def server(gpt_folder):
    from servekit.testing import ServerProcess

    # 2 workers x 16 threads: more than 16 running sequences means both workers feed the one batch
    with ServerProcess(gpt_folder.parent, workers=2, threads=16, env={"HF_HUB_OFFLINE": "1"}) as srv:
        yield srv


def gauge(server, name: str, model: str = "gpt", timeout: float = 10) -> float:
    text = requests.get(server.url + "/metrics", timeout=timeout).text
    values = [float(v) for v in re.findall(rf'^{name}\{{[^}}]*model="{model}"[^}}]*\}} (\S+)$', text, re.M)]
    return sum(values)


class GaugeWatcher:
    """Polls the running gauge in the background and keeps its highest value.

    Several pollers, each on its own connections: a poll that lands on a worker
    whose threads are all streaming waits there, and the others go on. A poll gives
    up after two seconds and tries again on a new connection, so that the pollers do not
    all end up waiting behind the streams of one worker (the workers need not take
    the streams half each).
    """

    def __init__(self, server, pollers: int = 4, model: str = "gpt"):
        self.server, self.model, self.highest, self.stopped = server, model, 0.0, threading.Event()
        self.threads = [threading.Thread(target=self._poll, daemon=True) for _ in range(pollers)]

    def _poll(self) -> None:
        while not self.stopped.is_set():
            try:
                running = gauge(self.server, "servekit_generation_running", self.model, timeout=2)
            except requests.Timeout:
                continue
            self.highest = max(self.highest, running)
            time.sleep(0.02)

    def __enter__(self) -> GaugeWatcher:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join()


def test_64_chat_streams_through_the_openai_client_share_one_batch(server, gpt_folder):
    from transformers import AutoTokenizer

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)

    def chat(stream: bool):
        return client.chat.completions.create(
            model="gpt",
            messages=MESSAGES,
            max_tokens=48,
            temperature=0,
            stream=stream,
            extra_body={"ignore_eos": True},
            **({"stream_options": {"include_usage": True}} if stream else {}),
        )

    alone = chat(False)
    # the worker formats the chat with the model's template (a copy of the host's tokenizer)
    tokenizer = AutoTokenizer.from_pretrained(gpt_folder)
    prompt = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert alone.usage.prompt_tokens == len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert alone.usage.completion_tokens == 48

    def streamed(_: int) -> tuple[str, int]:
        chunks = list(chat(True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return text, chunks[-1].usage.completion_tokens

    with GaugeWatcher(server) as watcher, ThreadPoolExecutor(STREAMS) as pool:
        results = list(pool.map(streamed, range(STREAMS)))
    assert results == [(alone.choices[0].message.content, 48)] * STREAMS  # greedy: the batch changed nothing
    assert watcher.highest > 1, watcher.highest
    assert gauge(server, "servekit_generation_queue_depth") == 0


def test_both_workers_feed_one_batch(server):
    """24 long streams at once: more than one worker's 16 threads' worth run in the host's batch,
    and threads are left over for the gauge's polls."""
    body = {"model": "gpt", "prompt": "hi", "max_tokens": 250, "temperature": 0, "stream": True, "ignore_eos": True}
    start = threading.Barrier(24, timeout=60)

    def stream(_: int) -> int:
        start.wait()
        with requests.post(server.url + "/v1/completions", json=body, stream=True, timeout=120) as response:
            return sum(1 for line in response.iter_lines() if line.startswith(b"data: {"))

    with GaugeWatcher(server) as watcher, ThreadPoolExecutor(24) as pool:
        events = list(pool.map(stream, range(24)))
    assert all(n > 2 for n in events)
    assert watcher.highest > 16, watcher.highest


def test_two_host_replicas_each_run_a_batch(server):
    """``replicas: 2``: the workers spread streams over both hosts, each a batch of at most four, so
    more than four run at once only when both batch; greedy answers match across the two."""
    body = {"model": "gpt-replicas", "prompt": "hi", "max_tokens": 250, "temperature": 0, "stream": True}
    body["ignore_eos"] = True
    start = threading.Barrier(8, timeout=60)

    def stream(_: int) -> str:
        start.wait()
        with requests.post(server.url + "/v1/completions", json=body, stream=True, timeout=120) as response:
            assert response.status_code == 200
            events = [line[6:] for line in response.iter_lines() if line.startswith(b"data: {")]
        return "".join(json.loads(e)["choices"][0]["text"] for e in events if json.loads(e)["choices"])

    with GaugeWatcher(server, model="gpt-replicas") as watcher, ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(stream, range(8)))
    assert len(set(texts)) == 1 and texts[0], texts
    assert watcher.highest > 4, watcher.highest
    assert gauge(server, "servekit_generation_queue_depth", "gpt-replicas") == 0


def test_64_streams_through_langchain_complete(server):
    langchain_openai = pytest.importorskip("langchain_openai")
    llm = langchain_openai.ChatOpenAI(
        base_url=server.url + "/v1",
        api_key="unused",
        model="gpt",
        max_tokens=24,
        temperature=0,
        max_retries=0,
        timeout=120,
    )
    expected = llm.invoke("hello there").content

    def streamed(_: int) -> str:
        return "".join(str(chunk.content) for chunk in llm.stream("hello there"))

    with ThreadPoolExecutor(STREAMS) as pool:
        texts = list(pool.map(streamed, range(STREAMS)))
    assert texts == [expected] * STREAMS


def test_a_client_that_disconnects_leaves_the_batch(server):
    body = {
        "model": "gpt",
        "prompt": "hello",
        "max_tokens": 200,
        "temperature": 1.0,
        "stream": True,
        "ignore_eos": True,
    }
    response = requests.post(server.url + "/v1/completions", json=body, stream=True, timeout=60)
    lines = response.iter_lines()
    got = [line for line in (next(lines) for _ in range(6)) if line.startswith(b"data: ")]
    assert got
    assert gauge(server, "servekit_generation_running") == 1
    response.close()  # the client goes away mid-stream
    deadline = time.monotonic() + 20
    while gauge(server, "servekit_generation_running") != 0:
        assert time.monotonic() < deadline, "the disconnected stream kept running"
        time.sleep(0.05)
    # the server is fine: the next request is answered in full
    result = requests.post(server.url + "/v1/completions", json={**body, "stream": False, "max_tokens": 5}, timeout=60)
    assert result.status_code == 200 and result.json()["usage"]["completion_tokens"] == 5


def test_bad_ignore_eos_is_a_400(server):
    r = requests.post(
        server.url + "/v1/completions", json={"model": "gpt", "prompt": "hi", "ignore_eos": "yes"}, timeout=30
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "ignore_eos"


def test_the_model_host_counts_its_prefix_cache_on_metrics(server):
    """A prompt sent twice: the host's cache holds its full blocks the second time, and ``/metrics``
    (read by a worker from the host's series) counts both lookups and the second one's hit."""
    prompt = "servekit serves models over many protocols; streams end with metadata. " * 4
    body = {"model": "gpt", "prompt": prompt, "max_tokens": 2, "temperature": 0}
    queries = gauge(server, "servekit_prefix_cache_queries_total")
    hits = gauge(server, "servekit_prefix_cache_hits_total")
    answers = [requests.post(server.url + "/v1/completions", json=body, timeout=60) for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 200]
    length = answers[0].json()["usage"]["prompt_tokens"]
    assert length > 32  # more than two blocks of 16
    assert gauge(server, "servekit_prefix_cache_queries_total") - queries == 2 * length
    # the first may find blocks of the module's earlier prompts; the second finds all of its own but the last token's
    assert gauge(server, "servekit_prefix_cache_hits_total") - hits >= (length - 1) // 16 * 16
    assert answers[0].json()["choices"][0]["text"] == answers[1].json()["choices"][0]["text"]
