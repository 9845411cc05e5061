"""DLRM's dot interaction: ember.nn.functional.interaction beside torch's composite, eager and compiled.

The composite is DLRM's ``interact_features`` (stack, bmm, gather the strict lower triangle, cat) at DLRM's Criteo
shapes: batch 2048, the dense vector and 26 pooled embeddings of 128. "forward + backward" runs autograd's backward
with a given gradient. Bytes: the least the interaction must move (read the 27 vectors, write the output row; in
backward read them and the output's gradient, write their gradients); the ceiling beside it is the in-place
a += b stream of the same run.

    python benchmarks/bench_interaction.py [--batch 2048] [--tables 26] [--dim 128] [--no-compile]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
from ember.nn.functional import interaction


def composite(dense: torch.Tensor, *sparse: torch.Tensor) -> torch.Tensor:
    x = torch.stack([dense, *sparse], dim=1)
    z = torch.bmm(x, x.transpose(1, 2))
    li, lj = torch.tril_indices(x.shape[1], x.shape[1], offset=-1)
    return torch.cat([dense, z[:, li, lj]], dim=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--tables", type=int, default=26)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args()
    b, n, d = args.batch, args.tables + 1, args.dim
    width = d + n * (n - 1) // 2

    bench = harness.Benchmark("interaction", f"DLRM dot interaction: batch {b}, {n} vectors of {d}")
    stream_fn, stream_bytes = harness.stream_kernel()
    gen = torch.Generator().manual_seed(0)
    peers = {"torch eager": composite, "ember": interaction}
    if not args.no_compile and hasattr(torch, "compile"):
        peers["torch.compile"] = torch.compile(composite)
    for dtype in (torch.float32, torch.bfloat16):
        size = torch.tensor([], dtype=dtype).element_size()
        xs = [torch.randn(b, d, generator=gen).to(dtype).requires_grad_() for _ in range(n)]
        grad = torch.randn(b, width, generator=gen).to(dtype)
        passes = {"forward": (n * d + width) * b * size, "forward + backward": (3 * n * d + width) * b * size}
        for pass_name, moved in passes.items():
            cases = {"ceiling": stream_fn}
            for name, fn in peers.items():
                if pass_name == "forward":
                    cases[name] = lambda fn=fn, xs=xs: fn(*xs)
                else:
                    cases[name] = lambda fn=fn, xs=xs, grad=grad: torch.autograd.grad(fn(*xs), xs, grad)
            with torch.no_grad() if pass_name == "forward" else torch.enable_grad():
                timings = bench.interleaved(cases, min_time=1.5 * len(cases))
            ceiling = stream_bytes / timings.pop("ceiling").median / 1e9
            for impl, t in timings.items():
                bench.add(dtype=str(dtype).replace("torch.", ""), pass_=pass_name, impl=impl, time=t, bytes=moved,
                          baseline=timings["torch eager"], ceiling_gbs=ceiling)  # fmt: skip
    bench.note(
        "speedup is over torch eager's composite; each dtype and pass timed its cases and the memory ceiling "
        "round-robin (harness.time_interleaved). GB/s counts the least bytes the interaction must move."
    )
    bench.write()


if __name__ == "__main__":
    main()
