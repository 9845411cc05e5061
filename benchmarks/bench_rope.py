"""The rotate-half rotary embedding: ember's kernel (csrc/rope/) beside torch, against the memory ceiling of the same
run.

A Llama-shaped query (32 heads of 128, [b, l, h, d] memory seen as [b, h, l, d]) rotated by [b, 1, l, d] tables, at
1 token (a decoded one), 128 and 2048 (a prefill), bf16 and fp32. Cases:

- torch eager: Hugging Face's ``q * cos + rotate_half(q) * sin``;
- torch.compile (Inductor) of the same function, where it compiles (``--no-compile`` skips it);
- ember graph node: the ``FusedRope`` module graph mode puts in the graph (output allocated per call);
- ember kernel, out=: ``ember._C.rotary_embedding`` into a preallocated output.

GB/s counts the bytes a fused pass must move: the query read and the result written (the tables, one row per
token, are small beside them).

    python benchmarks/bench_rope.py [--lengths 1,128,2048] [--no-compile]
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
from ember._optimize.graph.fuse_rope import fuse_rope
from ember._optimize.graph.rope_node import FusedRope
from ember._tensor import dlpack

HEADS, DIM = 32, 128


class ApplyRotary(nn.Module):
    def forward(self, q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        rotated = torch.cat((-q[..., DIM // 2 :], q[..., : DIM // 2]), dim=-1)
        return (q * cos) + (rotated * sin)


def fused_node(model: nn.Module) -> tuple[FusedRope, fx.GraphModule]:
    gm = fx.symbolic_trace(model)
    assert fuse_rope(gm) == 1
    [node] = [m for m in gm.modules() if isinstance(m, FusedRope)]
    return node, gm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="1,128,2048")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    args = parser.parse_args()

    bench = harness.Benchmark("rope", "Rotary embedding (rotate-half): ember's kernel beside torch")
    stream_fn, stream_bytes = harness.stream_kernel()
    torch.manual_seed(0)
    model = ApplyRotary().eval()
    _, gm = fused_node(model)
    compiled: Callable[..., Any] | None = None
    if not args.no_compile and hasattr(torch, "compile"):
        compiled = torch.compile(model, dynamic=False)
    for dtype in (torch.bfloat16, torch.float32):
        for length in (int(v) for v in args.lengths.split(",")):
            q = torch.randn(1, length, HEADS, DIM).to(dtype).transpose(1, 2)
            angles = torch.randn(1, length, DIM // 2).repeat(1, 1, 2)
            cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
            out = torch.empty_like(q)
            tables = (cos.unsqueeze(1), sin.unsqueeze(1))

            def kernel(x: torch.Tensor = q, t: tuple[torch.Tensor, ...] = tables, o: torch.Tensor = out) -> None:
                _C.rotary_embedding(dlpack(x), dlpack(t[0]), dlpack(t[1]), dlpack(o))

            cases: dict[str, Callable[[], Any]] = {
                "ceiling": stream_fn,
                "torch eager": lambda a=(q, cos, sin): model(*a),
                "ember graph node": lambda a=(q, cos, sin): gm(*a),
                "ember kernel, out=": kernel,
            }
            if compiled is not None:
                try:
                    with torch.no_grad():
                        compiled(q, cos, sin)
                    cases["torch.compile"] = lambda c=compiled, a=(q, cos, sin): c(*a)
                except Exception as error:  # a torch without a working compiler toolchain
                    bench.note(f"torch.compile skipped: {type(error).__name__}")
                    compiled = None
            with torch.no_grad():
                timings = bench.interleaved(cases, min_time=0.3 * len(cases))
            ceiling = stream_bytes / timings.pop("ceiling").median / 1e9
            moved = 2 * q.numel() * q.element_size()
            baseline = timings["torch eager"]
            for name, t in timings.items():
                bench.add(dtype=str(dtype).replace("torch.", ""), tokens=length, impl=name, time=t, bytes=moved,
                          baseline=baseline, ceiling_gbs=ceiling)  # fmt: skip
    bench.note(
        f"A query of {HEADS} heads of {DIM} in [b, l, h, d] memory, tables [1, l, {DIM}] in its dtype, unsqueezed over "
        "the heads. Each configuration's cases and the memory ceiling (in-place a += b over 2 x 256 MB) were timed "
        "round-robin; `pct_of_ceiling` compares with the ceiling of the same moments, `speedup` is over torch eager."
    )
    bench.write()


if __name__ == "__main__":
    main()
