"""Scaled dot-product attention: ember's flash-attention kernel (csrc/attention/) beside torch's, against the GEMM
ceiling of the same run.

Three attentions models bring: BERT-base's encoder (12 heads of 64, a padding mask of [batch, 1, 1, keys]) at
sequence 128 and 512, batch 1 and 16; a Llama-shaped prefill (32 query heads of 128 sharing 8 key/value heads,
causal) at 512 and 2048 tokens; and Whisper's (tiny) encoder over 30 s of audio (6 heads of 64, 1500 frames, no
mask; the attention is 40% of that model's batch-1 forward in graph mode; not with ``--quick``). And a few queries
against many keys, ember's few-query path (at most 4 queries a head): Whisper's decoder prompt of 4 tokens against
its encoder's 1500 frames, and a Llama-shaped decode step (one token, 32 query heads over 8 key/value heads of 128)
against 2048 cached keys at batch 1 and 16; these read each key and value once, so beside GFLOP/s they report the
keys' and values' bytes a second against the run's memory ceiling (the operands stay in the last-level cache from
call to call, so a share over 100% is possible). bf16 and fp32, operands laid out as a projection split into heads
gives them ([b, l, h, e] memory). Cases:

- torch SDPA: ``F.scaled_dot_product_attention`` (torch's fused CPU kernel; key/value heads repeated to the query
  heads first where this torch has no ``enable_gqa``, as Hugging Face's ``repeat_kv`` does);
- torch written out: matmul, scale, mask add, softmax, matmul (what a model without SDPA runs; BERT only);
- torch.compile of the SDPA call, where it compiles (``--no-compile`` skips it);
- ember graph node: the ``FusedAttention`` module graph mode puts in the graph (output allocated per call);
- ember kernel, out=: ``ember._C.scaled_dot_product_attention`` into a preallocated output.

GFLOP/s counts the two products' multiply-adds (4 · queries · keys · features per head; under the causal mask the
keys at or before each query only); `pct_of_gemm` compares with torch.mm's rate in the dtype, measured in the same
run.

    python benchmarks/bench_attention.py [--no-compile] [--quick | --few]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
from ember import _C
from ember._optimize.graph.attention_node import FusedAttention
from ember._optimize.graph.fuse_attention import fuse_attention
from ember._tensor import dlpack

# Calls of at most this many queries a head take ember's few-query path (csrc/attention/attention_kernels.h:
# kFewQueries), bound by reading the keys and values.
FEW_QUERIES = 4
HAS_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "").split("\n", 2)[1]


class Sdpa(nn.Module):
    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.causal = causal

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any) -> torch.Tensor:
        if k.shape[1] != q.shape[1]:  # grouped heads, shared out as Hugging Face's repeat_kv does
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)


class WrittenOut(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(q, k.transpose(-1, -2)) / 8.0 + mask
        return torch.matmul(torch.softmax(scores, dim=-1), v)


def fused_node(causal: bool, grouped: bool) -> FusedAttention:
    """The node graph mode would put in place of an SDPA call (with enable_gqa for grouped heads)."""

    class Call(nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any) -> torch.Tensor:
            kwargs = {"enable_gqa": True} if grouped else {}
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, **kwargs)

    gm = fx.symbolic_trace(Call(), concrete_args={"mask": None} if causal else None)
    assert fuse_attention(gm) == 1
    [node] = [m for m in gm.modules() if isinstance(m, FusedAttention)]
    return node


def heads(batch: int, length: int, count: int, features: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(batch, length, count, features).to(dtype).transpose(1, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    parser.add_argument("--quick", action="store_true", help="the shorter sequences only")
    parser.add_argument(
        "--few", action="store_true", help="the few-query shapes only, written as results/attention-few-<machine>"
    )
    args = parser.parse_args()

    bench = harness.Benchmark(
        "attention", "Scaled dot-product attention: ember's kernel beside torch's", part="few" if args.few else ""
    )
    peaks = bench.gemm_ceiling()
    stream = bench.stream_ceiling()
    torch.manual_seed(0)
    # (model, batch, queries, keys, query heads, key/value heads, features, causal, padded)
    configs = [("bert", 1, 128, 128, 12, 12, 64, False, True), ("bert", 16, 128, 128, 12, 12, 64, False, True)]
    configs += [("bert", 1, 512, 512, 12, 12, 64, False, True)]
    configs += [("llama prefill", 1, 512, 512, 32, 8, 128, True, False)]
    configs += [("whisper cross-attention", 1, 4, 1500, 6, 6, 64, False, False)]
    configs += [("llama decode", 1, 1, 2048, 32, 8, 128, False, False)]
    if not args.quick:
        configs += [("llama prefill", 1, 2048, 2048, 32, 8, 128, True, False)]
        configs += [("whisper encoder", 1, 1500, 1500, 6, 6, 64, False, False)]
        configs += [("llama decode", 16, 1, 2048, 32, 8, 128, False, False)]
    if args.few:
        configs = [c for c in configs if c[2] <= FEW_QUERIES]
    for model, batch, length, keys, hq, hkv, features, causal, padded in configs:
        grouped = hkv != hq
        for dtype in (torch.bfloat16, torch.float32):
            q = heads(batch, length, hq, features, dtype)
            k, v = heads(batch, keys, hkv, features, dtype), heads(batch, keys, hkv, features, dtype)
            mask = None
            if padded:  # the last quarter of every other sequence padded away
                mask = torch.ones(batch, 1, 1, length, dtype=torch.bool)
                mask[1::2, ..., 3 * length // 4 :] = False
            node = fused_node(causal, grouped and HAS_GQA)
            sdpa = Sdpa(causal)
            out = torch.empty(batch, length, hq, features, dtype=dtype).transpose(1, 2)
            scale = features**-0.5

            def kernel(o: torch.Tensor = out, t: tuple[Any, ...] = (q, k, v, mask), c: bool = causal,
                       s: float = scale) -> None:  # fmt: skip
                _C.scaled_dot_product_attention(
                    *(dlpack(x) if x is not None else None for x in t), c, s, dlpack(o)
                )  # fmt: skip

            node_args = (q, k, v, mask)
            if grouped and not HAS_GQA:  # the graph this torch gives: heads repeated before the call
                node_args = (q, k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1), mask)
            cases: dict[str, Callable[[], Any]] = {
                "torch SDPA": lambda a=(q, k, v, mask), m=sdpa: m(*a),
                "ember graph node": lambda n=node, a=node_args: n(*a),
                "ember kernel, out=": kernel,
            }
            if mask is not None:
                additive = torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)
                cases["torch written out"] = lambda a=(q, k, v, additive): WrittenOut()(*a)
            if not args.no_compile and hasattr(torch, "compile"):
                compiled = torch.compile(sdpa, dynamic=False)
                try:
                    with torch.no_grad():
                        compiled(q, k, v, mask)
                    cases["torch.compile"] = lambda c=compiled, a=(q, k, v, mask): c(*a)
                except Exception as error:  # a torch without a working compiler toolchain
                    bench.note(f"torch.compile skipped for {model} {length}: {type(error).__name__}")
            with torch.no_grad():
                timings = bench.interleaved(cases, min_time=0.3 * len(cases))
            pairs = length * (length + 1) // 2 if causal else length * keys
            flops = 4 * batch * hq * pairs * features
            peak = peaks[str(dtype).replace("torch.", "")]
            baseline = timings["torch SDPA"]
            few = length <= FEW_QUERIES
            for name, t in timings.items():
                gflops = flops / t.median / 1e9
                after = {"GFLOP_s": gflops, "pct_of_gemm": 100 * gflops / peak}
                if few:
                    kv_gbs = (k.numel() + v.numel()) * k.element_size() / t.median / 1e9
                    after |= {"kv_GB_s": kv_gbs, "pct_of_stream": 100 * kv_gbs / stream}
                bench.add(model=model, dtype=str(dtype).replace("torch.", ""), batch=batch, length=length, keys=keys,
                          heads=f"{hq}/{hkv}", impl=name, time=t, baseline=baseline, after=after)  # fmt: skip
    bench.note(
        "bert: 12 heads of 64, a bool padding mask [batch, 1, 1, keys] (the last quarter of every other sequence "
        "masked); llama prefill: 32 query heads of 128 over 8 key/value heads, causal; whisper cross-attention and "
        "llama decode: 4 and 1 queries a head against 1500 and 2048 keys (ember's few-query path), `kv_GB_s` the "
        "keys' and values' bytes a second against the run's memory ceiling. Operands in [b, l, h, e] "
        "memory. Each configuration's cases were timed round-robin; `speedup` is over torch SDPA; `pct_of_gemm` "
        "compares with torch.mm's rate in the dtype (2048^3, fastest tenth) in the same run."
    )
    bench.write()


if __name__ == "__main__":
    main()
