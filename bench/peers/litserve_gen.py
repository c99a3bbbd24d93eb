"""The LitServe peer of ``bench/generative.py``: the bench's saved GPT-2 behind LitServe's ``OpenAISpec``.

    python litserve_gen.py --model-dir FOLDER --port 8200 --workers 2

A ``LitAPI`` as LitServe's own streaming examples write one: ``setup`` loads
the folder with transformers, ``predict`` is a generator that runs a manual
token loop (one forward pass per new token over the KV cache, sampling at the
request's temperature) and yields each token's text, so the ``openai`` client
sees one chunk per token, as it does from servekit.  The end-of-text token's
logit is masked (the equivalent of servekit's ``ignore_eos``), so every answer
holds ``max_tokens`` tokens; the last chunk's usage says how many.  One request
at a time per inference worker (LitServe's batching would need a batched
decoding loop of our own: the peer is served as its users write it).
"""

from __future__ import annotations

import argparse

import litserve as ls
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


class GPT2Chat(ls.LitAPI):
    def __init__(self, folder: str, threads: int):
        super().__init__(spec=ls.OpenAISpec())
        self.folder = folder
        self.threads = threads

    def setup(self, device: str) -> None:
        torch.set_num_threads(self.threads)  # the cores shared out between the workers, as servekit's are
        self.tokenizer = AutoTokenizer.from_pretrained(self.folder)
        self.model = AutoModelForCausalLM.from_pretrained(self.folder).eval()
        self.eos = self.tokenizer.eos_token_id

    def predict(self, request, context):  # LitServe's ChatCompletionRequest, its context
        messages = [m.model_dump(exclude_none=True) for m in request.messages]
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
        if not isinstance(ids, torch.Tensor):  # transformers 5 answers a BatchEncoding
            ids = ids["input_ids"]
        prompt_tokens = int(ids.shape[-1])
        limit = request.max_completion_tokens or request.max_tokens or 128
        temperature = request.temperature or 0.0
        past = None
        with torch.inference_mode():
            for done in range(1, limit + 1):
                out = self.model(input_ids=ids, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits = out.logits[:, -1, :].float()
                logits[:, self.eos] = float("-inf")  # ignore_eos: every answer runs to max_tokens
                if temperature > 0:
                    ids = torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1)
                else:
                    ids = logits.argmax(-1, keepdim=True)
                yield {
                    "role": "assistant",
                    "content": self.tokenizer.decode(ids[0]),
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": done,
                    "total_tokens": prompt_tokens + done,
                }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--port", type=int, default=8200)
    parser.add_argument("--workers", type=int, default=2, help="inference worker processes")
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads per worker")
    args = parser.parse_args()
    api = GPT2Chat(args.model_dir, args.threads)
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=args.workers, timeout=False)
    server.run(host="127.0.0.1", port=args.port, generate_client_file=False, log_level="warning")


if __name__ == "__main__":
    main()
