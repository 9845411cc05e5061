"""Text generation: time to first token, next-token latency and decode throughput of Llama-shaped models (random
weights), for torch eager bf16, torch.compile (Hugging Face's static cache) and ``ember.llm.optimize``, through
``model.generate`` as a user calls it, with the same run's ceilings beside them.

    python benchmarks/bench_llm.py [--models 853m,1b,7b] [--cases 1x128,1x512,8x512,32x128,...]
                                   [--new-tokens 32] [--impls eager,compile,ember] [--part NAME]

A case is batch x prompt length.

- torch.compile: generate's own compiled decode step over a static cache (``compile_kwargs``).
- time to first token (``ttft_ms``): from the call of ``generate`` to its first new token (a streamer notes each
  token's arrival), the prompt's prefill; median over --repeats runs.
- next token (``next_ms``): the median gap between later tokens of those runs (N = --new-tokens each), every step
  of generate's loop included; ``tokens_s`` is batch / next_ms, the decode throughput.
- the decode roofline (``roofline_ms``): the bytes a token reads, every weight (the embedding's rows excepted, the
  LM head included) and the cache's keys and values of the context at mid-generation, at the read bandwidth of this
  run (a torch.sum over a float32 buffer eight times the last-level cache, at least 1 GiB: a read-only stream),
  measured before each model and implementation (``read_GB_s``: the Xeon's drifted 96-132 GB/s within a run);
  ``pct_roofline`` = roofline_ms / next_ms.
- the prefill ceiling (``pct_gemm``): the prefill's FLOPs (2 x the non-embedding weights x tokens, the causal
  attention's 2 x 2 x layers x heads x head_dim x prompt^2 / 2 per sequence, the LM head for one position) at this
  run's bf16 GEMM rate (torch.mm), over ttft_ms.
- ember's cache: ``cache_MiB`` the blocks a generation held at its end, ``kv_MiB`` the keys and values it stored.

Shapes: 853m is the issue's Llama (hidden 2048, 16 layers, 32 heads over 8 key/value heads, MLP 5632, vocab 32000);
1b Llama 3.2 1B's (MLP 8192, vocab 128256, tied embeddings); 7b Llama 2 7B's (hidden 4096, 32 layers, 32 heads, MLP
11008).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ember
import harness

SHAPES: dict[str, dict[str, Any]] = {
    "853m": {
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
    },
    "1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "tie_word_embeddings": True,
        "head_dim": 64,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "rope_theta": 500000.0,
    },
    "7b": {
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": 32000,
    },
}


def build(name: str) -> torch.nn.Module:
    """A Llama of shape `name`, random bf16 weights (N(0, 0.02), norms at 1), built on the meta device and filled in
    place: a 7B model's fp32 initialisation would take 27 GB and minutes. Same values on every run."""
    import transformers as t

    config = t.LlamaConfig(max_position_embeddings=4096, **SHAPES[name])
    with torch.device("meta"):
        model = t.LlamaForCausalLM(config)
    model = model.to_empty(device="cpu").to(torch.bfloat16)
    # Random values tiled from one 16M-element block: drawing 7B normal numbers would take minutes, and a weight's
    # values do not change how fast it streams.
    block = torch.randn(2**24, generator=torch.Generator().manual_seed(0)).mul_(0.02).to(torch.bfloat16)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.fill_(1.0)
                continue
            flat = p.view(-1)
            for start in range(0, flat.numel(), block.numel()):
                n = min(block.numel(), flat.numel() - start)
                flat[start : start + n].copy_(block[:n])
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)  # its buffers were left empty on meta
    if config.tie_word_embeddings:
        model.tie_weights()
    return model.eval()


def read_ceiling(min_time: float = 1.0) -> float:
    """GB/s of a read-only stream: torch.sum over a float32 buffer 8x the last-level cache (at least 1 GiB)."""
    elements = max(8 * harness.last_level_cache_bytes(), 2**30) // 4
    buf = torch.rand(elements)
    t = harness.time_call(lambda: buf.sum(), min_time=min_time, warmup=2)
    return 4 * elements / t.p10 / 1e9


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes a decode step reads of the weights: all but the embedding table (its rows are gathered), the LM head
    counted once when tied to it."""
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    total = sum(p.numel() * p.element_size() for p in model.parameters() if p is not embed)
    if head is embed:
        total += head.numel() * head.element_size()
    return total


def kv_bytes_per_position(config: Any, element: int = 2) -> int:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * element


def prefill_flops(model: torch.nn.Module, batch: int, prompt: int) -> float:
    config = model.config
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    body = sum(p.numel() for n, p in model.named_parameters() if p is not embed and p is not head and "norm" not in n)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    attention = 2 * 2 * config.num_hidden_layers * config.num_attention_heads * head_dim * prompt * prompt / 2
    return batch * (2.0 * body * prompt + attention + 2.0 * head.numel())


def compile_kwargs() -> dict[str, Any]:
    """generate's own torch.compile path, as Hugging Face documents it: a static cache, and the decode step compiled
    (generate compiles it by itself on GPUs; on a CPU the compile config must say all devices). The prefill runs
    eager."""
    from transformers import CompileConfig

    config = CompileConfig(fullgraph=False, dynamic=False, mode="default")
    config._compile_all_devices = True
    return {"cache_implementation": "static", "compile_config": config}


class TokenTimes:
    """A streamer that notes when each token arrives: ``generate`` hands it the prompt first, then each new token
    as it is sampled."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def generate_times(model: torch.nn.Module, batch: int, prompt: int, new_tokens: int, repeats: int,
                   **kwargs: Any) -> tuple[float, float, Any]:  # fmt: skip
    """(time to first token, next-token seconds, the last generate's output) through model.generate: the first
    token's arrival after the call began (median over the runs), and the median gap between later tokens (over
    every gap of every run: a step's time, not a difference of two runs' totals that the prefill's variance
    blurs)."""
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)

    def run(n: int) -> tuple[float, list[float], Any]:
        streamer = TokenTimes()
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             pad_token_id=0, return_dict_in_generate=True, streamer=streamer, **kwargs)  # fmt: skip
        arrivals = streamer.times[1:]  # (the first put is the prompt)
        return arrivals[0] - start, [b - a for a, b in zip(arrivals, arrivals[1:])], out

    run(3)  # warm-up (and torch.compile's compilations)
    runs = [run(new_tokens) for _ in range(repeats)]
    first = statistics.median(r[0] for r in runs)
    step = statistics.median(gap for r in runs for gap in r[1])
    return first, step, runs[-1][2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="853m")
    parser.add_argument("--cases", default="1x128,1x512,1x2048,8x128,8x512,32x128", help="batch x prompt")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--impls", default="eager,compile,ember")
    parser.add_argument("--compile-cases", default="1x512,8x512", help="batch x prompt cases torch.compile runs")
    parser.add_argument("--part", default="")
    args = parser.parse_args()
    cases = [tuple(int(x) for x in c.split("x")) for c in args.cases.split(",")]
    compile_cases = {tuple(int(x) for x in c.split("x")) for c in args.compile_cases.split(",") if c}

    bench = harness.Benchmark("llm", "Text generation: ember.llm beside torch eager and torch.compile", args.part)
    bench.ceilings["memory read"] = "read_GB_s: torch.sum over a float32 buffer 8x the LLC, before each model"
    gemm = bench.gemm_ceiling(dtypes=(torch.bfloat16,))["bfloat16"]
    for name in args.models.split(","):
        for impl in args.impls.split(","):
            model = build(name)  # afresh for each: nothing one implementation did stays for the next
            weights = weight_bytes(model)
            per_position = kv_bytes_per_position(model.config)
            if impl == args.impls.split(",")[0]:
                bench.note(
                    f"{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, "
                    f"{weights / 1e9:.3f} GB of weights read per token"
                )
            read_gbs = read_ceiling(0.5)  # beside each implementation's cases: the host's bandwidth drifts
            if impl == "ember":
                ember.llm.optimize(model, dtype=torch.bfloat16)
            kwargs: dict[str, Any] = {}
            if impl == "compile":
                kwargs.update(compile_kwargs())
            for batch, prompt in cases:
                if impl == "compile" and (batch, prompt) not in compile_cases:
                    continue
                if impl == "compile":  # one cache size for every call (else each new length compiles again)
                    kwargs["max_cache_len"] = prompt + args.new_tokens
                ttft, step, out = generate_times(model, batch, prompt, args.new_tokens, args.repeats, **kwargs)
                roofline = (weights + batch * (prompt + args.new_tokens // 2) * per_position) / (read_gbs * 1e9)
                gemm_s = prefill_flops(model, batch, prompt) / (gemm * 1e9)
                row: dict[str, Any] = {"model": name, "impl": impl, "batch": batch, "prompt": prompt,
                                       "ttft_ms": ttft * 1e3, "pct_gemm": 100 * gemm_s / ttft, "next_ms": step * 1e3,
                                       "tokens_s": batch / step, "roofline_ms": roofline * 1e3,
                                       "pct_roofline": 100 * roofline / step, "read_GB_s": read_gbs}  # fmt: skip
                cache = getattr(out, "past_key_values", None)
                if impl == "ember" and cache is not None:
                    row["cache_MiB"] = cache.nbytes / 2**20
                    row["kv_MiB"] = batch * (prompt + args.new_tokens - 1) * per_position / 2**20
                bench.record(row)
                del out, cache
                gc.collect()
            if impl == "compile":
                torch._dynamo.reset()
            del model
            gc.collect()
    bench.write()


if __name__ == "__main__":
    main()
