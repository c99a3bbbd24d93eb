"""Prometheus series of generative models: the signals LLM routers, autoscalers and dashboards read.

Every series is written twice: under servekit's name (label ``model``) and under
vLLM's ``vllm:`` name (label ``model_name``, vLLM's bucket bounds), so the Gateway
API Inference Extension's model-server protocol (``vllm:num_requests_waiting``,
``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc``), vLLM's Grafana
dashboards and KEDA recipes read a servekit replica unchanged.

Where each one is measured:

- **the data plane**, for every generative model (a ``complete`` hook of any
  plugin or ``model.py``), per choice: time to first token, end-to-end latency,
  prompt and completion tokens, and the finish reason (:func:`choice_done`);
- **the model's engine**, where one runs (the Hugging Face continuous-batching
  scheduler), in the process that runs it (a worker, or the model host every
  worker feeds), through the :class:`GenerationGauges` it gets from
  :func:`generation_gauges`: sequences running and waiting, the batch's places,
  the prefix cache's queries, hits and bytes, and per sequence its time waiting,
  in prefill and in decode, and the time between its tokens.

Gauges are prometheus_client's multiprocess ``livesum``: the values of every
live process add up.  The KV-cache usage is a ratio of two such sums (sequences
running over the batches' places), computed when ``/metrics`` is read
(:class:`CacheUsageCollector`), so two workers with a batch each, or a model
host fed by both, report one correct number.  Histograms and counters are summed
in plain Python per process and flushed in the background
(:mod:`servekit.observability.tally`): a token costs a few list updates, not a
file write.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Iterable, Iterator
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any

from servekit.observability.tally import Tally, add_to_histogram
from servekit.types import GenerationTiming

# -- bucket bounds ---------------------------------------------------------------------------

#: vLLM's bounds (vllm/v1/metrics/loggers.py), so its dashboards' quantiles read the same
VLLM_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
VLLM_TOKEN_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
VLLM_REQUEST_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
#: vLLM's 1-2-5 bounds for token counts, up to a context of a million tokens
VLLM_LENGTH_BUCKETS = tuple(m * 10**e for e in range(7) for m in (1, 2, 5))

#: servekit's own bounds: finer at the small end, where a CPU model's tokens and short answers land
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TOKEN_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass(frozen=True)
class Series:
    """One Prometheus family a measurement is written to."""

    name: str
    doc: str
    #: ``model`` (servekit's) or ``model_name`` (vLLM's)
    label: str
    #: histogram bounds; ``None`` for a counter
    buckets: tuple[float, ...] | None = None
    #: a second label (a counter's finish reason)
    extra: str | None = None


def _pair(servekit: str, vllm: list[str], doc: str, ours: tuple[float, ...], theirs: tuple[float, ...]) -> list[Series]:
    return [Series(servekit, doc, "model", ours)] + [Series(name, doc, "model_name", theirs) for name in vllm]


#: measurement -> the families it is written to
HISTOGRAMS: dict[str, list[Series]] = {
    "ttft": _pair(
        "servekit_generation_time_to_first_token_seconds",
        ["vllm:time_to_first_token_seconds"],
        "seconds from a generation's arrival to its first token",
        LATENCY_BUCKETS,
        VLLM_TTFT_BUCKETS,
    ),
    "e2e": _pair(
        "servekit_generation_e2e_seconds",
        ["vllm:e2e_request_latency_seconds"],
        "seconds from a generation's arrival to its last token",
        LATENCY_BUCKETS,
        VLLM_REQUEST_BUCKETS,
    ),
    "inter_token": _pair(
        "servekit_generation_inter_token_seconds",
        ["vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"],
        "seconds between a sequence's consecutive tokens",
        TOKEN_BUCKETS,
        VLLM_TOKEN_BUCKETS,
    ),
    "per_output_token": _pair(
        "servekit_generation_time_per_output_token_seconds",
        ["vllm:request_time_per_output_token_seconds"],
        "a sequence's decode seconds per token after its first",
        TOKEN_BUCKETS,
        VLLM_TOKEN_BUCKETS,
    ),
    "queue": _pair(
        "servekit_generation_queue_seconds",
        ["vllm:request_queue_time_seconds"],
        "seconds a sequence waited for a place in the running batch",
        LATENCY_BUCKETS,
        VLLM_REQUEST_BUCKETS,
    ),
    "prefill": _pair(
        "servekit_generation_prefill_seconds",
        ["vllm:request_prefill_time_seconds"],
        "seconds from a sequence joining the batch to its first token",
        LATENCY_BUCKETS,
        VLLM_REQUEST_BUCKETS,
    ),
    "decode": _pair(
        "servekit_generation_decode_seconds",
        ["vllm:request_decode_time_seconds"],
        "seconds from a sequence's first token to its last",
        LATENCY_BUCKETS,
        VLLM_REQUEST_BUCKETS,
    ),
    "inference": _pair(
        "servekit_generation_inference_seconds",
        ["vllm:request_inference_time_seconds"],
        "seconds a sequence spent in the running batch (prefill and decode)",
        LATENCY_BUCKETS,
        VLLM_REQUEST_BUCKETS,
    ),
    "prompt_length": [
        Series("vllm:request_prompt_tokens", "prompt tokens of a generation", "model_name", VLLM_LENGTH_BUCKETS)
    ],
    "generation_length": [
        Series("vllm:request_generation_tokens", "tokens a generation produced", "model_name", VLLM_LENGTH_BUCKETS)
    ],
}

COUNTERS: dict[str, list[Series]] = {
    "prompt_tokens": [
        Series("servekit_generation_prompt_tokens", "prompt tokens of finished generations", "model"),
        Series("vllm:prompt_tokens", "prompt tokens of finished generations", "model_name"),
    ],
    "generation_tokens": [
        Series("servekit_generation_completion_tokens", "tokens finished generations produced", "model"),
        Series("vllm:generation_tokens", "tokens finished generations produced", "model_name"),
    ],
    "finished": [
        Series(
            "servekit_generation_requests", "generations finished, by finish reason", "model", extra="finish_reason"
        ),
        Series("vllm:request_success", "generations finished, by finish reason", "model_name", extra="finished_reason"),
    ],
}

#: vLLM's finish reason for a stream the client left before its end
ABORT = "abort"


# -- histograms and counters, summed per process -------------------------------------------


class _Families:
    """Every histogram and counter family, made on first use (after the fork, with the folder set)."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Histogram

        self.by_name: dict[str, Any] = {}
        for group in HISTOGRAMS.values():
            for s in group:
                assert s.buckets is not None
                self.by_name[s.name] = Histogram(s.name, s.doc, (s.label,), buckets=s.buckets)
        for group in COUNTERS.values():
            for s in group:
                labels = (s.label,) if s.extra is None else (s.label, s.extra)
                self.by_name[s.name] = Counter(s.name, s.doc, labels)


_families: _Families | None = None
_families_lock = threading.Lock()


def _histogram_families() -> _Families:
    global _families
    if _families is None:
        with _families_lock:
            if _families is None:
                _families = _Families()
    return _families


class _GenerationTally(Tally):
    """This process's observations since the last flush: ``(series, labels) -> [sum, slots]`` and counts."""

    thread_name = "servekit-generation-metrics"

    def reset(self) -> None:
        self._histograms: dict[tuple[str, tuple[str, ...]], list[Any]] = {}
        self._counts: dict[tuple[str, tuple[str, ...]], float] = {}

    def observe(self, measurement: str, model: str, value: float, times: int = 1) -> None:
        with self._lock:
            for s in HISTOGRAMS[measurement]:
                self._add(s, model, value, times)
        self.started()

    def observe_many(self, measurement: str, model: str, values: Iterable[float]) -> None:
        with self._lock:
            for value in values:
                for s in HISTOGRAMS[measurement]:
                    self._add(s, model, value, 1)
        self.started()

    def _add(self, s: Series, model: str, value: float, times: int) -> None:
        assert s.buckets is not None
        key = (s.name, (model,))
        entry = self._histograms.get(key)
        if entry is None:
            entry = self._histograms[key] = [0.0, [0] * (len(s.buckets) + 1)]
        entry[0] += value * times
        entry[1][bisect.bisect_left(s.buckets, value)] += times

    def count(self, counter: str, model: str, amount: float, extra: str | None = None) -> None:
        with self._lock:
            for s in COUNTERS[counter]:
                key = (s.name, (model,) if s.extra is None else (model, extra or ""))
                self._counts[key] = self._counts.get(key, 0) + amount
        self.started()

    def flush(self) -> None:
        with self._lock:
            histograms, self._histograms = self._histograms, {}
            counts, self._counts = self._counts, {}
        if not histograms and not counts:
            return
        families = _histogram_families().by_name
        for (name, labels), (total, slots) in histograms.items():
            add_to_histogram(self.child(families[name], name, labels), total, slots)
        for (name, labels), amount in counts.items():
            if amount:
                self.child(families[name], name, labels).inc(amount)


_tally = _GenerationTally()


def flush() -> None:
    """Write this process's sums into the shared values now (a scrape)."""
    _tally.flush()


# -- the data plane's side: one finished choice ------------------------------------------------


def choice_done(
    model: str,
    *,
    first_token: float | None,
    total: float,
    prompt_tokens: int,
    completion_tokens: int,
    finish_reason: str,
) -> None:
    """One choice of a generation ended: its time to first token (``None``: it produced none) and
    end-to-end seconds, both from the generation's arrival, its token counts and finish reason."""
    if first_token is not None:
        _tally.observe("ttft", model, first_token)
    _tally.observe("e2e", model, total)
    _tally.observe("prompt_length", model, prompt_tokens)
    _tally.observe("generation_length", model, completion_tokens)
    _tally.count("prompt_tokens", model, prompt_tokens)
    _tally.count("generation_tokens", model, completion_tokens)
    _tally.count("finished", model, 1, finish_reason)
    charged = _quota_tokens.get()
    if charged is not None:  # the key's tokens per minute (servekit.server.quotas)
        charged[0] += prompt_tokens + completion_tokens


#: the tokens the HTTP request being answered in this context used, for its key's quota
_quota_tokens: ContextVar[list[int] | None] = ContextVar("servekit_quota_tokens", default=None)


def count_tokens() -> list[int]:
    """Start counting the tokens of this context's generations (prompt and completion, per choice)
    into the one-item list returned; it keeps counting while a streamed answer is read out."""
    charged = [0]
    _quota_tokens.set(charged)
    return charged


# -- a whole answer's timing, in TGI's response headers ------------------------------------------

#: the headers of the HTTP request being answered in this context (``None`` outside one)
_answer_headers: ContextVar[list[tuple[str, str]] | None] = ContextVar("servekit_generation_headers", default=None)


def headers_for_answer() -> tuple[list[tuple[str, str]], Token]:
    """Start collecting the timing headers of one HTTP request (the observe middleware); the
    list fills if a whole generation is answered; give the token back to :func:`headers_done`."""
    headers: list[tuple[str, str]] = []
    return headers, _answer_headers.set(headers)


def headers_done(token: Token) -> None:
    try:
        _answer_headers.reset(token)
    except ValueError:  # reset from another context
        _answer_headers.set(None)


def _ms(seconds: float) -> str:
    return str(int(seconds * 1000))  # whole milliseconds, as TGI writes them


def answer_timed(total: float, prompt_tokens: int, completion_tokens: int, timing: GenerationTiming | None) -> None:
    """A whole generation was answered: TGI's headers for it (``x-total-time``, ``x-queue-time``,
    ``x-inference-time``, ``x-time-per-token`` in milliseconds; ``x-prompt-tokens``,
    ``x-generated-tokens``).  The queue and inference times only when the model measured them
    (``timing``: every choice's, summed)."""
    headers = _answer_headers.get()
    if headers is None:
        return
    headers.clear()
    headers.append(("x-total-time", _ms(total)))
    if timing is not None:
        inference = timing.prefill + timing.decode
        headers.append(("x-queue-time", _ms(timing.queue)))
        headers.append(("x-inference-time", _ms(inference)))
        headers.append(("x-time-per-token", _ms(inference / completion_tokens if completion_tokens else 0.0)))
    headers.append(("x-prompt-tokens", str(prompt_tokens)))
    headers.append(("x-generated-tokens", str(completion_tokens)))


# -- the engine's side: gauges and one sequence's timing -----------------------------------------

_gauge_families_lock = threading.Lock()
_gauge_families: dict[str, Any] | None = None

RUNNING = "servekit_generation_running"
WAITING = "servekit_generation_queue_depth"
SLOTS = "servekit_generation_batch_slots"
PREFIX_BYTES = "servekit_prefix_cache_bytes"
PREFIX_BUDGET = "servekit_prefix_cache_budget_bytes"


def _gauges() -> dict[str, Any]:
    global _gauge_families
    with _gauge_families_lock:
        if _gauge_families is None:
            from prometheus_client import Counter, Gauge

            ours = ("model", "version")
            theirs = ("model_name",)

            def gauge(name: str, doc: str, labels: tuple[str, ...]) -> Any:
                return Gauge(name, doc, labels, multiprocess_mode="livesum")

            _gauge_families = {
                "running": gauge(RUNNING, "sequences in a generative model's running batch", ours),
                "waiting": gauge(WAITING, "generation requests waiting to join a model's running batch", ours),
                "slots": gauge(SLOTS, "places in a generative model's running batches (max_num_seqs each)", ours),
                "prefix_bytes": gauge(PREFIX_BYTES, "bytes of keys and values a model's prefix cache keeps", ours),
                "prefix_budget": gauge(PREFIX_BUDGET, "bytes a model's prefix cache may keep (prefix_cache_mb)", ours),
                "queried": Counter(
                    "servekit_prefix_cache_queries",
                    "prompt tokens a generative model looked up in its prefix cache",
                    ours,
                ),
                "hit": Counter(
                    "servekit_prefix_cache_hits",
                    "prompt tokens a generative model found in its prefix cache (not computed again)",
                    ours,
                ),
                "vllm_running": gauge(
                    "vllm:num_requests_running", "Number of requests in model execution batches.", theirs
                ),
                "vllm_waiting": gauge(
                    "vllm:num_requests_waiting", "Number of requests waiting to be processed.", theirs
                ),
                "vllm_queried": Counter(
                    "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", theirs
                ),
                "vllm_hit": Counter(
                    "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", theirs
                ),
            }
    return _gauge_families


class _ModelSums:
    """This process's running and waiting sequences per model, over its versions (vLLM's series have no version)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values: dict[tuple[str, str], tuple[int, int]] = {}

    def set(self, model: str, version: str, running: int, waiting: int) -> tuple[int, int]:
        with self.lock:
            self.values[(model, version)] = (running, waiting)
            pairs = [v for (m, _), v in self.values.items() if m == model]
        return sum(r for r, _ in pairs), sum(w for _, w in pairs)


_model_sums = _ModelSums()
os.register_at_fork(after_in_child=lambda: _model_sums.values.clear())


class _Counted:
    """A counter child written to two families (servekit's and vLLM's)."""

    def __init__(self, *children: Any) -> None:
        self.children = children

    def inc(self, amount: float = 1) -> None:
        if amount:
            for child in self.children:
                child.inc(amount)


class GenerationGauges:
    """One model version's engine series: what a continuous-batching scheduler reports.

    ``update`` after each step (sequences running and waiting), ``batch_slots`` and
    ``prefix_cache`` when they change, ``token_gaps`` as tokens come, and
    ``sequence_done`` once per sequence that produced a token.
    """

    def __init__(self, families: dict[str, Any], model: str, version: str) -> None:
        self.model, self.version = model, version
        self.running = families["running"].labels(model, version)
        self.queued = families["waiting"].labels(model, version)
        self.slots = families["slots"].labels(model, version)
        self.prefix_bytes = families["prefix_bytes"].labels(model, version)
        self.prefix_budget = families["prefix_budget"].labels(model, version)
        self.vllm_running = families["vllm_running"].labels(model)
        self.vllm_waiting = families["vllm_waiting"].labels(model)
        self.prefix_queried = _Counted(
            families["queried"].labels(model, version), families["vllm_queried"].labels(model)
        )
        self.prefix_hit = _Counted(families["hit"].labels(model, version), families["vllm_hit"].labels(model))

    def update(self, running: int, waiting: int) -> None:
        """Sequences in the batch and waiting for it, now.  Waiting is written first: a sequence
        moving into the batch is, to a scrape in between, in neither, never in both."""
        all_running, all_waiting = _model_sums.set(self.model, self.version, running, waiting)
        self.queued.set(waiting)
        self.vllm_waiting.set(all_waiting)
        self.running.set(running)
        self.vllm_running.set(all_running)

    def batch_slots(self, slots: int) -> None:
        """Places in this process's running batch (0 once it stopped)."""
        self.slots.set(slots)

    def prefix_cache(self, kept: int, budget: int) -> None:
        """Bytes the prefix cache keeps and may keep."""
        self.prefix_bytes.set(kept)
        self.prefix_budget.set(budget)

    def token_gaps(self, gaps: Iterable[float]) -> None:
        """Seconds between consecutive tokens of sequences (one per token after a sequence's first)."""
        _tally.observe_many("inter_token", self.model, gaps)

    def sequence_done(self, queue: float, prefill: float, decode: float, tokens: int) -> None:
        """A sequence left the batch: seconds it waited, to its first token once running, and from
        its first token to its last, and how many tokens it produced."""
        _tally.observe("queue", self.model, queue)
        _tally.observe("prefill", self.model, prefill)
        _tally.observe("decode", self.model, decode)
        _tally.observe("inference", self.model, prefill + decode)
        if tokens > 1:
            _tally.observe("per_output_token", self.model, decode / (tokens - 1))


def generation_gauges(model: str, version: str) -> GenerationGauges:
    """The engine series of one model version, families made on first use."""
    return GenerationGauges(_gauges(), model, version)


# -- the ratios, computed when /metrics is read ------------------------------------------------


class CacheUsageCollector:
    """KV-cache and prefix-cache usage per model, each a ratio of sums over every live process.

    The KV-cache usage is the share of the running batches' places holding a
    sequence (``servekit_generation_running`` over ``servekit_generation_batch_slots``):
    at 1 a new request waits, as vLLM's reaches 1 when every KV block is held.
    """

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        sums = _live_sums((RUNNING, SLOTS, PREFIX_BYTES, PREFIX_BUDGET))
        if not sums:
            return
        kv = GaugeMetricFamily(
            "servekit_generation_kv_cache_usage_ratio",
            "share of a model's running-batch places holding a sequence (1: new requests wait)",
            labels=["model"],
        )
        perc = GaugeMetricFamily(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels=["model_name"]
        )
        gpu = GaugeMetricFamily(
            "vllm:gpu_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage. DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
            labels=["model_name"],
        )
        prefix = GaugeMetricFamily(
            "servekit_prefix_cache_usage_ratio",
            "share of a model's prefix-cache budget its kept blocks use",
            labels=["model"],
        )
        for model, values in sorted(sums.items()):
            slots = values.get(SLOTS, 0.0)
            if slots > 0:
                usage = min(1.0, max(0.0, values.get(RUNNING, 0.0) / slots))
                for family in (kv, perc, gpu):
                    family.add_metric([model], usage)
            budget = values.get(PREFIX_BUDGET, 0.0)
            if budget > 0:
                prefix.add_metric([model], min(1.0, max(0.0, values.get(PREFIX_BYTES, 0.0) / budget)))
        yield from (kv, perc, gpu, prefix)


def _live_sums(names: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """``model -> series -> value`` summed over versions and live processes, for these gauges."""
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if folder:
        import glob

        from prometheus_client.multiprocess import MultiProcessCollector

        files = glob.glob(os.path.join(folder, "gauge_livesum_*.db"))
        metrics: Iterable[Any] = MultiProcessCollector.merge(files, accumulate=True) if files else []
    else:
        from prometheus_client import REGISTRY

        metrics = REGISTRY.collect()
    sums: dict[str, dict[str, float]] = {}
    for metric in metrics:
        if metric.name not in names:
            continue
        for sample in metric.samples:
            model = sample.labels.get("model", "")
            entry = sums.setdefault(model, {})
            entry[metric.name] = entry.get(metric.name, 0.0) + sample.value
    return sums
