"""LayerNorm and RMSNorm with the residual add before them: ember's row-norm kernel (csrc/norm/row_norm.cpp) beside
torch, against the memory ceiling of the same run.

Two shapes of transformer norm: BERT's post-norm ``LayerNorm(x + residual)`` (the sum read once, not kept) and
Llama's pre-norm ``h = x + residual; RMSNorm(h)`` in Hugging Face's hand-written form (the sum kept: it is the next
residual). Rows of 1 (a decoded token), 32 and 2048 (a prefill), hidden 768 and 4096, bf16 and fp32 activations
with fp32 weights (as ``ember.optimize(dtype=torch.bfloat16)`` leaves them). Cases:

- torch eager: the graph's own operations;
- torch.compile (Inductor) of the same function, where it compiles (``--no-compile`` skips it);
- ember graph node: the ``FusedNorm`` module graph mode puts in the graph (output allocated per call, as in a model);
- ember kernel, out=: ``ember._C.row_norm`` into preallocated outputs, the kernel and its binding alone.

GB/s counts the bytes a fused pass must move: x and the residual read, the result (and the kept sum) written.

    python benchmarks/bench_norm.py [--rows 1,32,2048] [--hidden 768,4096] [--no-compile]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
from ember import _C
from ember._optimize.graph.fuse_norm import fuse_norms
from ember._optimize.graph.norm_node import FusedNorm
from ember._optimize.graph.refs import TensorOperands
from ember._tensor import dlpack


class PostNorm(nn.Module):
    """BERT's output block: LayerNorm(x + residual)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.norm(x + residual)


class PreRMSNorm(nn.Module):
    """Llama's pre-norm: h = x + residual, then Hugging Face's LlamaRMSNorm of h; h is the next residual."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x + residual
        input_dtype = h.dtype
        h32 = h.to(torch.float32)
        variance = h32.pow(2).mean(-1, keepdim=True)
        normalized = h32 * torch.rsqrt(variance + 1e-6)
        return self.weight * normalized.to(input_dtype), h


def fused_node(model: nn.Module) -> FusedNorm:
    gm = fx.symbolic_trace(model)
    assert fuse_norms(gm, TensorOperands(model, gm)) == 1
    [node] = [m for m in gm.modules() if isinstance(m, FusedNorm)]
    return node


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,32,2048")
    parser.add_argument("--hidden", default="768,4096")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    args = parser.parse_args()
    rows_list = [int(r) for r in args.rows.split(",")]
    hidden_list = [int(h) for h in args.hidden.split(",")]

    bench = harness.Benchmark("norm", "LayerNorm / RMSNorm with the residual add: ember's kernel beside torch")
    stream_fn, stream_bytes = harness.stream_kernel()
    torch.manual_seed(0)
    for kind, make in (("layer", PostNorm), ("rms", PreRMSNorm)):
        for hidden in hidden_list:
            model = make(hidden).eval()
            node = fused_node(model)
            compiled: Callable[..., Any] | None = None
            if not args.no_compile and hasattr(torch, "compile"):
                compiled = torch.compile(model, dynamic=False)
            for dtype in (torch.bfloat16, torch.float32):
                for rows in rows_list:
                    x = torch.randn(rows, hidden).to(dtype)
                    residual = torch.randn(rows, hidden).to(dtype)
                    weight = model.norm.weight if kind == "layer" else model.weight
                    bias = model.norm.bias if kind == "layer" else None
                    out, kept = torch.empty_like(x), torch.empty_like(x) if kind == "rms" else None
                    # The RMS result takes the fp32 weight's dtype (weight * normalized.to(bf16)), as the graph does
                    out = torch.empty(rows, hidden, dtype=torch.float32) if kind == "rms" else out
                    eps = 1e-12 if kind == "layer" else 1e-6
                    tensors = (x, residual, weight.detach(), None if bias is None else bias.detach())
                    outputs = (out, kept)

                    def kernel(t: tuple[Any, ...] = tensors, o: tuple[Any, ...] = outputs, k: str = kind,
                               e: float = eps) -> None:  # fmt: skip
                        _C.row_norm(k, *(dlpack(v) if v is not None else None for v in t), e,
                                    *(dlpack(v) if v is not None else None for v in o))  # fmt: skip

                    cases: dict[str, Callable[[], Any]] = {
                        "ceiling": stream_fn,
                        "torch eager": lambda m=model, a=x, r=residual: m(a, r),
                        "ember graph node": lambda n=node, a=x, r=residual: n(a, r),
                        "ember kernel, out=": kernel,
                    }
                    if compiled is not None:
                        try:
                            with torch.no_grad():
                                compiled(x, residual)
                            cases["torch.compile"] = lambda c=compiled, a=x, r=residual: c(a, r)
                        except Exception as error:  # a torch without a working compiler toolchain
                            bench.note(f"torch.compile skipped for {kind} {hidden}: {type(error).__name__}")
                            compiled = None
                    with torch.no_grad():
                        timings = bench.interleaved(cases, min_time=0.4 * len(cases))
                    ceiling = stream_bytes / timings.pop("ceiling").median / 1e9
                    element = x.element_size()
                    moved = rows * hidden * (2 * element + out.element_size() + (element if kept is not None else 0))
                    baseline = timings["torch eager"]
                    for name, t in timings.items():
                        bench.add(norm=kind, dtype=str(dtype).replace("torch.", ""), rows=rows, hidden=hidden,
                                  impl=name, time=t, bytes=moved, baseline=baseline, ceiling_gbs=ceiling)  # fmt: skip
    bench.note(
        "layer: LayerNorm(x + residual), the sum not kept (BERT's output block); rms: h = x + residual, "
        "Hugging Face's LlamaRMSNorm of h, h kept (Llama's pre-norm), its result in fp32 as the fp32 weight makes "
        "it. Each configuration's cases and the memory ceiling (in-place a += b over 2 x 256 MB) were timed "
        "round-robin; `pct_of_ceiling` compares with the ceiling of the same moments, `speedup` is over torch eager."
    )
    bench.write()


if __name__ == "__main__":
    main()
