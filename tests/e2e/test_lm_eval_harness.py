"""lm-evaluation-harness's ``local-completions`` against a real ``servekit serve``: a small
loglikelihood task (``tests/data/lm_eval/tiny_choice.yaml`` and its jsonl, read offline)
scored through the server gives, item by item and choice by choice, the log-likelihoods
lm-evaluation-harness's own ``hf`` backend computes on the same model folder (to 1e-3).

``local-completions`` sends each context and continuation as token ids with ``echo: true``,
``logprobs: 1`` and ``max_tokens: 1``, and sums the continuation's prompt log-probabilities:
the prompt scored in the prefill pass.  Model: the tiny GPT-2 (random weights).
"""

from __future__ import annotations

import importlib.util

import pytest
import yaml
from generative_models import build_tiny_gpt2
from repo_paths import DATA

pytestmark = pytest.mark.slow  # starts a real server, imports torch

# lm_eval (and accelerate, the hf backend's) are imported where used: their import takes seconds,
# and a parallel run collects every module in every worker
if importlib.util.find_spec("lm_eval") is None or importlib.util.find_spec("accelerate") is None:
    pytest.skip("lm-eval and accelerate are needed", allow_module_level=True)

TASK_FOLDER = DATA / "lm_eval"


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    config = yaml.safe_load((TASK_FOLDER / "tiny_choice.yaml").read_text())
    config["dataset_kwargs"]["data_files"]["test"] = str(TASK_FOLDER / "tiny_choice.jsonl")
    config["dataset_kwargs"]["cache_dir"] = str(tmp_path_factory.mktemp("datasets-cache"))  # not the user's
    return config


def per_item(model: str, model_args: dict, task: dict) -> list[list[float]]:
    """Each item's log-likelihood of each choice, as the harness logged them."""
    import lm_eval

    out = lm_eval.simple_evaluate(
        model=model, model_args=model_args, tasks=[dict(task)], log_samples=True, bootstrap_iters=0
    )
    samples = sorted(out["samples"][task["task"]], key=lambda s: s["doc_id"])
    return [[resp[0][0] for resp in sample["resps"]] for sample in samples]


def test_local_completions_log_likelihoods_equal_the_hf_backends(tmp_path, task, monkeypatch):
    from servekit.testing import ServerProcess

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = build_tiny_gpt2(tmp_path / "repo" / "gpt")
    with ServerProcess(tmp_path / "repo", env={"HF_HUB_OFFLINE": "1"}) as server:
        served = per_item(
            "local-completions",
            {
                "model": "gpt",
                "base_url": server.url + "/v1/completions",
                "tokenizer_backend": "huggingface",
                "tokenizer": str(folder),
                "max_length": 256,
                "num_concurrent": 1,
                "max_retries": 1,
            },
            task,
        )
    local = per_item("hf", {"pretrained": str(folder), "device": "cpu", "dtype": "float32"}, task)
    assert len(served) == len(local) == 4 and all(len(choices) == 3 for choices in served)
    for served_item, local_item in zip(served, local):
        assert served_item == pytest.approx(local_item, abs=1e-3)
