"""Pooling: ember's kernels (csrc/pool/) beside torch, against the memory ceiling of the same run.

Channels-last activations, as graph mode's convolutions write them, bf16 and fp32. Max pools: ResNet-50's stem pool
([n, 64, 112, 112], 3x3, stride 2, padding 1) at batch 1 and 16 and a VGG-16 pool ([n, 128, 112, 112], 2x2, stride
2) at batch 16. Cases:

- torch eager: ``F.max_pool2d`` alone;
- torch eager, ReLU + pool: ``F.max_pool2d(x.relu_())``, a stem's ReLU and pool as torch runs them;
- torch.compile of the ReLU + pool, where it compiles (``--no-compile`` skips it);
- ember: ``ember.nn.functional.max_pool2d`` (output allocated per call);
- ember, ReLU taken in: the kernel with its ReLU on the pooled values, what graph mode runs for a stem's ReLU and pool.

Average pools: DenseNet-121's first transition ([16, 128, 56, 56], 2x2, stride 2), ResNet-50's head (a global
pool of [16, 2048, 7, 7]), an EfficientNet squeeze-excitation's global pool at batch 1 ([1, 672, 14, 14]); cases
torch eager, torch.compile and ember.

GB/s counts the bytes a pool must move: its input read once and its output written.

    python benchmarks/bench_pool.py [--no-compile] [--part NAME]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
from ember.nn.functional import adaptive_avg_pool2d, avg_pool2d, max_pool2d
from ember.nn.pooling import max_pool2d_on_kernel

# (name, batch, channels, size, kernel, stride, padding)
SHAPES = [
    ("resnet50 stem", 1, 64, 112, 3, 2, 1),
    ("resnet50 stem", 16, 64, 112, 3, 2, 1),
    ("vgg16 pool2", 16, 128, 112, 2, 2, 0),
]


def relu_then_pool(x: torch.Tensor, kernel: int, stride: int, padding: int) -> torch.Tensor:
    return F.max_pool2d(torch.relu(x), kernel, stride, padding)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    parser.add_argument("--part", default="", help="a suffix for the results file")
    args = parser.parse_args()

    bench = harness.Benchmark("pool", "Max pooling: ember's kernel beside torch", part=args.part)
    stream_fn, stream_bytes = harness.stream_kernel()
    torch.manual_seed(0)
    compiled: Callable[..., Any] | None = None
    if not args.no_compile and hasattr(torch, "compile"):
        compiled = torch.compile(relu_then_pool, dynamic=False)
    for dtype in (torch.bfloat16, torch.float32):
        for name, batch, channels, size, kernel, stride, padding in SHAPES:
            x = torch.randn(batch, channels, size, size).to(dtype).contiguous(memory_format=torch.channels_last)
            window = ([kernel] * 2, [stride] * 2, [padding] * 2, [1, 1], False)
            expected = F.max_pool2d(torch.relu(x), kernel, stride, padding)
            fused = max_pool2d_on_kernel(x, *window, relu=True)
            assert fused is not None and torch.equal(fused, expected)
            cases: dict[str, Callable[[], Any]] = {
                "ceiling": stream_fn,
                "torch eager": lambda x=x, k=kernel, s=stride, p=padding: F.max_pool2d(x, k, s, p),
                "torch eager, ReLU + pool": lambda x=x, k=kernel, s=stride, p=padding: F.max_pool2d(x.relu(), k, s, p),
                "ember": lambda x=x, k=kernel, s=stride, p=padding: max_pool2d(x, k, s, p),
                "ember, ReLU taken in": lambda x=x, w=window: max_pool2d_on_kernel(x, *w, relu=True),
            }
            if compiled is not None:
                try:
                    with torch.no_grad():
                        compiled(x, kernel, stride, padding)
                    cases["torch.compile, ReLU + pool"] = lambda c=compiled, x=x, k=kernel, s=stride, p=padding: c(
                        x, k, s, p
                    )
                except Exception as error:  # a torch without a working compiler toolchain
                    bench.note(f"torch.compile skipped: {type(error).__name__}")
                    compiled = None
            record(bench, cases, stream_bytes, x, expected, f"{name} b{batch}")
    run_averages(bench, stream_fn, stream_bytes, not args.no_compile)
    bench.note(
        "Channels-last inputs of random values. Each configuration's cases and the memory ceiling (in-place a += b "
        "over 2 x 256 MB) were timed round-robin; `pct_of_ceiling` compares with the ceiling of the same moments, "
        "`speedup` is over torch eager's pool alone (the ReLU + pool rows do more work: a stem's two steps)."
    )
    bench.write()


def record(bench: harness.Benchmark, cases: dict[str, Callable[[], Any]], stream_bytes: int, x: torch.Tensor,
           out: torch.Tensor, shape: str) -> None:  # fmt: skip
    """Times one configuration's cases round-robin with the memory ceiling ("ceiling") among them, and records them
    against torch eager's, with the bytes a pool moves (its input read, its output written)."""
    with torch.no_grad():
        timings = bench.interleaved(cases, min_time=0.3 * len(cases))
    ceiling = stream_bytes / timings.pop("ceiling").median / 1e9
    moved = (x.numel() + out.numel()) * x.element_size()
    baseline = timings["torch eager"]
    for impl, t in timings.items():
        bench.add(dtype=str(x.dtype).replace("torch.", ""), shape=shape, impl=impl, time=t, bytes=moved,
                  baseline=baseline, ceiling_gbs=ceiling)  # fmt: skip


# (name, shape, kernel or None for a global pool)
AVERAGES = [
    ("densenet121 transition1", (16, 128, 56, 56), 2),
    ("resnet50 head", (16, 2048, 7, 7), None),
    ("efficientnet SE b1", (1, 672, 14, 14), None),
]


def run_averages(bench: harness.Benchmark, stream_fn: Callable[[], Any], stream_bytes: int, compile_: bool) -> None:
    for dtype in (torch.bfloat16, torch.float32):
        for name, shape, kernel in AVERAGES:
            x = torch.randn(*shape).to(dtype).contiguous(memory_format=torch.channels_last)

            def torch_pool(t: torch.Tensor, k: int | None = kernel) -> torch.Tensor:
                return F.avg_pool2d(t, k) if k is not None else F.adaptive_avg_pool2d(t, 1)

            def ember_pool(t: torch.Tensor = x, k: int | None = kernel) -> torch.Tensor:
                return avg_pool2d(t, k) if k is not None else adaptive_avg_pool2d(t, 1)

            expected = torch_pool(x)
            torch.testing.assert_close(ember_pool(), expected, rtol=1e-5, atol=1e-6)
            cases: dict[str, Callable[[], Any]] = {
                "ceiling": stream_fn,
                "torch eager": lambda x=x, f=torch_pool: f(x),
                "ember": ember_pool,
            }
            if compile_ and hasattr(torch, "compile"):
                try:
                    compiled = torch.compile(torch_pool, dynamic=False)
                    with torch.no_grad():
                        compiled(x)
                    cases["torch.compile"] = lambda c=compiled, x=x: c(x)
                except Exception as error:  # a torch without a working compiler toolchain
                    bench.note(f"torch.compile skipped: {type(error).__name__}")
            record(bench, cases, stream_bytes, x, expected, f"avg: {name}")


if __name__ == "__main__":
    main()
