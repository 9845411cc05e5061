"""Linear layers: ember (oneDNN's matmul on a prepacked weight, or ember on the weight in place) beside torch's
F.linear.

In place means no copy of the weight, which is what ember.optimize runs for a weight already in the compute dtype:
ember's skinny matmul (csrc/skinny/) for up to ``_C.Linear.skinny_rows(dtype)`` rows (32 for bf16 where AMX
runs, 8 otherwise), oneDNN's matmul on torch's [N, K] layout beyond. K-major (``w.t().contiguous().t()``, the same
logical tensor stored transposed) is measured beside it as the other layout a weight could be kept in without a
copy.

"ember module" is what a user of ``ember.optimize`` gets: an ``nn.Linear`` holding the same weight, optimized for
inference and called as a module (under torch.inference_mode). It pays the Python path around the kernel and takes
torch's kernel wherever ember measured torch faster, so it is the row to read for "is ember ever slower". Its
speedup is against "torch nn.Linear", the stock module called the same way (a module call costs a few
microseconds more than F.linear); every other row's is against F.linear.

Shapes: N = K = 4096 (the issue's reference), BERT-base's projections (768x768, 3072x768, 768x3072) and an LLM MLP
(11008x4096), at M = 1 .. 1024 rows, float32 and bfloat16 (torch runs bf16 on bf16 weights, as a model cast with
.to(torch.bfloat16) does). Every call allocates its output, as a model's does. GFLOP/s = 2·M·N·K / time; GB/s counts
the weight alone (what bounds small M). The ceilings are torch.mm's rate at 2048³ and the in-place stream.

A prepacked bf16 layer's calls of 1 to 8 rows run on ember's few-row matmul (csrc/tile_matmul/) where AVX512-BF16
runs: "ember prepacked, oneDNN" runs the same calls on oneDNN's matmul over the same copy, beside it.

    python benchmarks/bench_linear.py [--ms 1,2,4,8,16,32,256,1024] [--shapes 4096x4096,...] [--part NAME]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ember
import harness
from ember import _C
from ember._tensor import dlpack

SHAPES = ["4096x4096", "768x768", "3072x768", "768x3072", "11008x4096"]
MS = [1, 2, 4, 8, 16, 32, 256, 1024]


def kernel_name(impl: str, layer: _C.Linear | None, weight: torch.Tensor | None, m: int) -> str:
    """The kernel an ember case ran (the layer's implementation() for its router's choice), or nothing."""
    if impl == "ember prepacked, oneDNN":
        return "onednn (forced)"
    if layer is None:
        return ""
    return layer.implementation(m, None if weight is None else dlpack(weight))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ms", default=",".join(map(str, MS)))
    parser.add_argument("--shapes", default=",".join(SHAPES), help="NxK (out_features x in_features)")
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds per case and shape")
    parser.add_argument("--part", default="", help="write results/linear-<part>-<machine> (a subset's run)")
    args = parser.parse_args()
    ms = [int(m) for m in args.ms.split(",")]
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]

    bench = harness.Benchmark("linear", "Linear: ember (prepacked / in place) beside torch F.linear", part=args.part)
    dtypes = [torch.float32] + ([torch.bfloat16] if _C.Linear.supported("bfloat16") else [])
    peaks = bench.gemm_ceiling(dtypes=tuple(dtypes))  # (a bf16 torch.mm takes minutes without AVX-512)
    bench.stream_ceiling()
    if len(dtypes) == 1:
        bench.note("oneDNN has no bf16 matmul on this CPU (it needs AVX-512): bf16 rows are left out.")
    for n, k in shapes:
        w32 = torch.randn(n, k) / k**0.5
        b32 = torch.randn(n)
        for dtype in dtypes:
            compute = str(dtype).replace("torch.", "")
            w, b = w32.to(dtype), b32.to(dtype)
            w_kmajor = w.t().contiguous().t()
            packed = _C.Linear(dlpack(w32), dlpack(b32), compute, True, 64)
            plain = _C.Linear(dlpack(w), dlpack(b32), compute, False, 64)
            kmajor = _C.Linear(dlpack(w_kmajor), dlpack(b32), compute, False, 64)
            stock = nn.Linear(k, n, dtype=dtype).eval()
            with torch.no_grad():
                stock.weight.copy_(w)
                stock.bias.copy_(b)
            module = ember.optimize(stock, dtype=dtype)
            for m in ms:
                x = torch.randn(m, k).to(dtype)

                def run(layer, weight, x=x, m=m, n=n, dtype=dtype):
                    out = torch.empty(m, n, dtype=dtype)
                    layer.forward(dlpack(x), None if weight is None else dlpack(weight), dlpack(out))
                    return out

                ref = F.linear(x, w, b).float()
                for layer, weight in ((packed, None), (plain, w), (kmajor, w_kmajor)):
                    err = (run(layer, weight).float() - ref).abs().max().item() / ref.abs().max().item()
                    assert err < (2e-2 if dtype == torch.bfloat16 else 1e-4), (n, k, m, dtype, err)
                cases = {
                    "torch F.linear": lambda x=x, w=w, b=b: F.linear(x, w, b),
                    "ember prepacked": lambda packed=packed: run(packed, None),
                    "ember in place": lambda plain=plain, w=w: run(plain, w),
                    "ember K-major": lambda kmajor=kmajor, w_kmajor=w_kmajor: run(kmajor, w_kmajor),
                    "torch nn.Linear": lambda stock=stock, x=x: stock(x),
                    "ember module": lambda module=module, x=x: module(x),
                }
                if packed.implementation(m).startswith("ember:few_rows"):  # oneDNN on the same copy, beside it

                    def on_onednn(packed=packed, x=x, m=m, n=n, dtype=dtype):
                        out = torch.empty(m, n, dtype=dtype)
                        packed.forward(dlpack(x), None, dlpack(out), kernel="onednn")
                        return out

                    cases["ember prepacked, oneDNN"] = on_onednn
                with torch.inference_mode():
                    err = (module(x).float() - ref).abs().max().item() / ref.abs().max().item()
                    assert err < (2e-2 if dtype == torch.bfloat16 else 1e-4), (n, k, m, dtype, err, "module")
                    timings = bench.interleaved(cases, min_time=args.min_time * len(cases))
                flops = 2 * m * n * k
                for impl, t in timings.items():
                    layer, weight = {
                        "ember prepacked": (packed, None),
                        "ember prepacked, oneDNN": (packed, None),
                        "ember in place": (plain, w),
                        "ember K-major": (kmajor, w_kmajor),
                    }.get(impl, (None, None))
                    bench.add(
                        shape=f"{n}x{k}",
                        dtype=compute,
                        M=m,
                        impl=impl,
                        time=t,
                        bytes=w.numel() * w.element_size(),
                        baseline=timings["torch nn.Linear" if impl == "ember module" else "torch F.linear"],
                        GFLOP_s=flops / t.median / 1e9,
                        pct_of_peak=100 * flops / t.median / 1e9 / peaks[compute],
                        onednn=kernel_name(impl, layer, weight, m),
                    )
            bench.note(
                f"{n}x{k} {compute}: prepacked copy {packed.packed_bytes() / 2**20:.1f} MiB "
                f"(weight {w.numel() * w.element_size() / 2**20:.1f} MiB in {compute})"
            )
    bench.write()


if __name__ == "__main__":
    main()
