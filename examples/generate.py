"""Text generation with ember.llm: a prompt in, tokens streamed out as they are generated, tokens/s printed.

    python examples/generate.py --model /path/to/hf-model "Once upon a time"   # a local Hugging Face model
    python examples/generate.py "def fibonacci(n):"                            # a small random Llama (no download)
    ember-run --ncores-per-instance 16 examples/generate.py --model ... "..."   # a server's thread placement

Without --model the example builds a 4-layer Llama from a config with random weights and a byte-level vocabulary
(each token one byte), so it runs anywhere, offline: the text it writes is noise, the speed is real.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import torch

import ember


class ByteTokenizer:
    """Token i is byte i: enough to feed a random model a prompt and print what it says."""

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor([list(text.encode())], dtype=torch.long)

    def decode(self, ids: list[int]) -> str:
        return bytes(i % 256 for i in ids).decode(errors="replace")


class PrintStreamer:
    """Prints each new token as generate hands it over, and notes when the first and the last arrived."""

    def __init__(self, decode: Any) -> None:
        self.decode = decode
        self.prompt_seen = False
        self.times: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:  # generate hands the prompt over first
            self.prompt_seen = True
            return
        self.times.append(time.perf_counter())
        print(self.decode(value.flatten().tolist()), end="", flush=True)

    def end(self) -> None:
        print()


def load(model_dir: str | None, dtype: torch.dtype) -> tuple[torch.nn.Module, Any, Any]:
    import transformers

    if model_dir is not None:
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=dtype)
        return model, lambda text: tokenizer(text, return_tensors="pt").input_ids, tokenizer.decode
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                                      num_attention_heads=16, num_key_value_heads=4)  # fmt: skip
    torch.manual_seed(0)
    bytes_ = ByteTokenizer()
    return transformers.LlamaForCausalLM(config), bytes_.encode, bytes_.decode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prompt", nargs="?", default="The quick brown fox")
    parser.add_argument("--model", help="a local Hugging Face model directory (default: a small random Llama)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--sample", action="store_true", help="sample (top-k 50) instead of greedy decoding")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)

    model, encode, decode = load(args.model, dtype)
    model = ember.llm.optimize(model.eval(), dtype=dtype)
    ids = encode(args.prompt)
    streamer = PrintStreamer(decode)
    print(args.prompt, end="", flush=True)
    start = time.perf_counter()
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                   min_new_tokens=args.max_new_tokens, do_sample=args.sample, top_k=50, streamer=streamer,
                   pad_token_id=0)  # fmt: skip
    times = streamer.times
    first = times[0] - start
    rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")
    where = f"{ember.isa.active_isa()}, {torch.get_num_threads()} threads"
    print(f"\n{len(ids[0])} prompt tokens, {len(times)} new: first token after {first * 1e3:.0f} ms, then "
          f"{rate:.1f} tokens/s ({where})", file=sys.stderr)  # fmt: skip


if __name__ == "__main__":
    main()
