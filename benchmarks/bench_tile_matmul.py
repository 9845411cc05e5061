"""The tile matmul (csrc/tile_matmul/) beside oneDNN's matmul on the same packed bf16 weights, and torch's bf16
F.linear, where it matters: BERT-base's 48 GEMMs (12 layers of 768->2304, 768->768, 768->3072, 3072->768, each
layer its own weights) called in a forward's order, at 32 to 512 rows (a batch-1 sequence of 32-512 tokens).

In a forward's order each layer's weights arrive from the last-level cache (170 MB of bf16 weights beside the
cores' L2); "hot" calls the first layer's four GEMMs twelve times each, its weights in L2, for the same work. The
gap between the two is what the tile matmul's prefetch of each thread's next panel aims at. Every call goes through
``ember._C.Linear.forward`` with ``kernel="tiles"`` or ``kernel="onednn"`` (the router sends 33-384 rows to the
tiles), so both carry the same Python cost per call (a few microseconds, in the times). Needs AMX.

    python benchmarks/bench_tile_matmul.py [--rows 32,64,128,192,256,384,512]
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
from ember import _C
from ember._tensor import dlpack

SHAPES = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]  # (in_features, out_features) of a BERT-base layer
LAYERS = 12


Layers = list[tuple[Any, torch.Tensor]]  # (ember layer, torch's bf16 weight)


def on(
    kernel: str, order: list[int], layers: Layers, x: dict[int, torch.Tensor], outs: list[torch.Tensor]
) -> Callable[[], None]:
    """The layers in ``order`` on ember's ``kernel``, each into its preallocated output."""

    def run() -> None:
        for i in order:
            layer, w = layers[i]
            layer.forward(dlpack(x[w.shape[1]]), None, dlpack(outs[i]), kernel=kernel)

    return run


def torch_linear(order: list[int], layers: Layers, x: dict[int, torch.Tensor]) -> Callable[[], None]:
    """The same GEMMs as torch's F.linear on the bf16 weights."""

    def run() -> None:
        for i in order:
            w = layers[i][1]
            F.linear(x[w.shape[1]], w)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="32,64,128,192,256,384,512")
    parser.add_argument("--min-time", type=float, default=1.5, help="seconds per case and row count")
    args = parser.parse_args()
    if _C.active_isa() != "amx":
        print(f"the tile matmul runs on AMX only; this CPU's ISA under the cap is {_C.active_isa()}: nothing measured")
        return

    bench = harness.Benchmark("tile_matmul", "Tile matmul: BERT-base's GEMMs in a forward's order, bf16")
    ceiling = bench.gemm_ceiling(dtypes=(torch.bfloat16,))["bfloat16"]
    torch.manual_seed(0)
    layers: Layers = []
    for _ in range(LAYERS):
        for k, n in SHAPES:
            w = torch.randn(n, k) / k**0.5
            layers.append((_C.Linear(dlpack(w), None, "bfloat16", True), w.bfloat16()))
    flop_per_row = 2 * LAYERS * sum(k * n for k, n in SHAPES)
    for rows in (int(r) for r in args.rows.split(",")):
        x = {k: torch.randn(rows, k).bfloat16() for k in (768, 3072)}
        outs = [torch.empty(rows, w.shape[0], dtype=torch.bfloat16) for _, w in layers]
        hot = [i for i in range(len(SHAPES)) for _ in range(LAYERS)]  # layer 0's four GEMMs, twelve times each

        forward = list(range(len(layers)))
        cases = {
            "tile matmul, forward order": on("tiles", forward, layers, x, outs),
            "oneDNN, forward order": on("onednn", forward, layers, x, outs),
            "torch F.linear, forward order": torch_linear(forward, layers, x),
            "tile matmul, hot": on("tiles", hot, layers, x, outs),
            "oneDNN, hot": on("onednn", hot, layers, x, outs),
        }
        with torch.no_grad():
            for case in cases.values():
                case()
            timings = bench.interleaved(cases, min_time=args.min_time)
        baseline = timings["oneDNN, forward order"]
        for name, t in timings.items():
            impl, order = name.split(", ")
            gflops = flop_per_row * rows / t.median / 1e9
            bench.add(rows=rows, impl=impl, order=order, time=t, baseline=baseline,
                      after={"GFLOP_s": gflops, "pct_of_ceiling": 100 * gflops / ceiling})  # fmt: skip
    bench.note(
        f"{LAYERS} layers x {len(SHAPES)} GEMMs of BERT-base, weights random (bf16 copies of fp32, packed once by "
        "oneDNN for 64 rows: the copy both ember kernels read), x in bf16, outputs bf16 and preallocated. `speedup` is "
        "over oneDNN in the forward's order at the same row count; `pct_of_ceiling` against torch.mm's bf16 rate at "
        "2048^3 in the same run. The cases of a row count were timed round-robin."
    )
    bench.write()


if __name__ == "__main__":
    main()
