"""Recognising and loading a local Hugging Face folder.

A folder is ours when it holds ``config.json`` with a ``model_type``, safetensors
weights and tokenizer files.  Causal language models (architectures ending in
``ForCausalLM`` / ``LMHeadModel``) serve completions and chat; everything else
(encoders, sentence-transformers folders) serves embeddings, except a
``*ForSequenceClassification`` folder (or a sentence-transformers CrossEncoder):
with one label it scores pairs (``score``: rerank and score), with several it
classifies (``classify``).  ``options.task`` (``generate``, ``embed``, ``score``
or ``classify``) overrides the guess.  Nothing is fetched from a hub:
loading is ``local_files_only`` and ``trust_remote_code`` stays off.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from servekit.types import ModelConfig

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "tokenizer.model")
CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
TASKS = ("generate", "embed", "score", "classify")
CLASSIFIER_SUFFIX = "ForSequenceClassification"
DTYPES = ("auto", "float32", "float16", "bfloat16")


class LoadError(RuntimeError):
    """The folder looks like a Hugging Face model but cannot be served; the message says why."""


def read_hf_config(path: Path) -> dict[str, Any] | None:
    """``config.json`` when it describes a transformers model, else ``None`` (not our folder)."""
    config_file = path / "config.json"
    if not config_file.is_file():
        return None
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) and "model_type" in config else None


def check_files(path: Path) -> None:
    if not (any(path.glob("*.safetensors")) or (path / "model.safetensors.index.json").is_file()):
        pickles = [p.name for p in path.glob("*.bin")]
        hint = (
            f" (found {', '.join(pickles)}: pickle weights are not loaded; convert them to safetensors)"
            if pickles
            else ""
        )
        raise LoadError(f"no safetensors weights in the Hugging Face folder{hint}")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise LoadError(f"no tokenizer files in the Hugging Face folder; expected one of {', '.join(TOKENIZER_FILES)}")


def task_of(path: Path, hf_config: dict[str, Any], options: dict[str, Any]) -> str:
    task = options.get("task")
    if task is not None:
        if task not in TASKS:
            raise LoadError(f"options.task must be one of {', '.join(TASKS)}, found {task!r}")
        return task
    architectures = hf_config.get("architectures") or []
    if _is_cross_encoder(path) or any(str(a).endswith(CLASSIFIER_SUFFIX) for a in architectures):
        labels = hf_config.get("num_labels") or len(hf_config.get("id2label") or {}) or 2
        return "score" if labels == 1 else "classify"
    if (path / "modules.json").is_file():
        return "embed"
    if any(str(a).endswith(CAUSAL_SUFFIXES) for a in architectures):
        return "generate"
    return "embed"


def _is_cross_encoder(path: Path) -> bool:
    """A sentence-transformers ``CrossEncoder`` folder (its config names the model type)."""
    config = path / "config_sentence_transformers.json"
    try:
        return config.is_file() and json.loads(config.read_text()).get("model_type") == "CrossEncoder"
    except (OSError, ValueError):
        return False


def pick_device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise LoadError(f"device {requested!r} was requested but CUDA is not available")
    return requested


def set_threads(options: dict[str, Any]) -> None:
    """torch's intra-op threads: ``options.intra_op_threads``, else the worker's share of the CPUs
    (in a model host, every CPU but one: the HTTP workers that feed it parse and stream on that one).

    torch starts one thread per core in every process: two workers batching on two
    cores would run four threads that spin waiting for each other, and a host on
    every core has a thread descheduled whenever a worker runs, which every
    operation then waits for (on 2 CPUs, 2 host threads cost 3x the CPU per token
    of 1).  The setting is the process's, so the last model loaded decides it.
    """
    import torch
    from servekit import available_cpus, cpus_per_worker, in_host

    from .options import positive_option

    threads = positive_option(options, "intra_op_threads") or (
        max(1, available_cpus() - 1) if in_host() else cpus_per_worker()
    )
    torch.set_num_threads(threads)


def pick_dtype(options: dict[str, Any], device: str) -> Any:
    import torch

    name = options.get("dtype", "auto")
    if name not in DTYPES:
        raise LoadError(f"options.dtype must be one of {', '.join(DTYPES)}, found {name!r}")
    if name == "auto":
        # CPU kernels are fastest and exact in float32; on a GPU the checkpoint's own dtype
        return torch.float32 if device == "cpu" else "auto"
    return getattr(torch, name)


def load_folder(path: Path, config: ModelConfig, name: str = "model", version: int = 1) -> Any | None:
    """The loaded model (:class:`CausalLM`, :class:`Encoder` or :class:`SequenceClassifier`), or ``None`` for another plugin's folder."""
    if config.plugin not in (None, "huggingface"):
        return None
    hf_config = read_hf_config(path)
    if hf_config is None:
        if config.plugin == "huggingface":
            raise LoadError("plugin: huggingface, but the folder has no config.json with a model_type")
        return None
    check_files(path)
    options = config.options or {}
    task = task_of(path, hf_config, options)
    device = pick_device(config.device)
    dtype = pick_dtype(options, device)
    if device == "cpu":
        set_threads(options)

    import transformers

    transformers.utils.logging.disable_progress_bar()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    if task == "generate":
        from .causal import CausalLM

        model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
        causal = model.to(device).eval()
        return CausalLM(causal, tokenizer, device, options, name, version)
    if task in ("score", "classify"):
        from .cross_encoder import SequenceClassifier

        classifier = transformers.AutoModelForSequenceClassification.from_pretrained(
            path, local_files_only=True, dtype=dtype
        )
        if task == "score" and classifier.config.num_labels != 1:
            raise LoadError(
                f"options.task score needs a model with one label, this one has {classifier.config.num_labels}"
            )
        return SequenceClassifier(classifier.to(device).eval(), tokenizer, device, path, task, options)
    from .encoder import Encoder

    model = transformers.AutoModel.from_pretrained(path, local_files_only=True, dtype=dtype)
    return Encoder(model.to(device).eval(), tokenizer, device, path, options)
