"""fp32 <-> bf16 conversion: ember.bf16 (every ISA path) beside torch, against the memory ceiling.

Bytes per element: round reads 4 and writes 2; split reads 4 and writes 2 + 2; join reads 2 + 2 and writes 4.
Outputs are preallocated (as an optimizer keeps them), so the figures are the kernels', not the page faults of
fresh allocations; one "alloc" row per op shows the cost of the allocating call as users write it.

    python benchmarks/bench_bf16.py [--elements 67108864] [--no-compile]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ember
import harness

BYTES = {"round": 6, "split": 8, "join": 8}


def torch_split(x: torch.Tensor, top: torch.Tensor, bottom: torch.Tensor) -> None:
    bits = x.view(torch.int32)
    top.view(torch.int16).copy_(bits >> 16)
    bottom.copy_(bits & 0xFFFF)


def torch_split_halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    bits = x.view(torch.int32)
    return (bits >> 16).to(torch.int16), (bits & 0xFFFF).to(torch.int16)


def torch_join(top: torch.Tensor, bottom: torch.Tensor, out: torch.Tensor) -> None:
    out.view(torch.int32).copy_((top.view(torch.int16).to(torch.int32) << 16) | (bottom.to(torch.int32) & 0xFFFF))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--elements", type=int, default=64 * 2**20)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    args = parser.parse_args()
    n = args.elements

    bench = harness.Benchmark("bf16", f"fp32 <-> bf16 conversion, {n / 2**20:.0f}M elements")
    stream_fn, stream_bytes = harness.stream_kernel()

    x = torch.randn(n) * 10
    top, bottom = ember.bf16.split(x)
    rounded = torch.empty(n, dtype=torch.bfloat16)
    joined = torch.empty(n)

    peers = {
        "round": {
            "torch .to(bf16), alloc": lambda: x.to(torch.bfloat16),
            "torch copy_ into bf16": lambda: rounded.copy_(x),
            "ember, alloc": lambda: ember.bf16.round(x),
        },
        "split": {"torch bit ops": lambda: torch_split(x, top, bottom), "ember, alloc": lambda: ember.bf16.split(x)},
        "join": {
            "torch bit ops": lambda: torch_join(top, bottom, joined),
            "ember, alloc": lambda: ember.bf16.join(top, bottom),
        },
    }
    if not args.no_compile and hasattr(torch, "compile"):
        try:
            compiled_round = torch.compile(lambda a: a.to(torch.bfloat16), dynamic=False)
            compiled_split = torch.compile(torch_split_halves, dynamic=False)
            compiled_round(x)
            compiled_split(x)
            peers["round"]["torch.compile, alloc"] = lambda: compiled_round(x)
            peers["split"]["torch.compile, alloc"] = lambda: compiled_split(x)
        except Exception as error:  # a torch without a working compiler toolchain
            bench.note(f"torch.compile peer skipped: {type(error).__name__}: {error}")

    ours = {
        "round": lambda: ember.bf16.round(x, out=rounded),
        "split": lambda: ember.bf16.split(x, out=(top, bottom)),
        "join": lambda: ember.bf16.join(top, bottom, out=joined),
    }
    ceilings = []
    for op in ("round", "split", "join"):
        cases = {"ceiling": stream_fn, **peers[op]}
        for level in ember.isa.supported_levels():
            with ember.isa.capped(level):
                impl = ember._C.bf16_implementation(op)
            name = f"ember {impl}, out="
            if name not in cases:  # a higher level with no path of its own for this op is not timed again

                def capped(level: str = level, fn=ours[op]) -> None:
                    with ember.isa.capped(level):
                        fn()

                cases[name] = capped
        timings = bench.interleaved(cases, min_time=3.0 * len(cases) / 4)
        ceiling = stream_bytes / timings.pop("ceiling").median / 1e9
        ceilings.append(ceiling)
        baseline = timings[next(iter(peers[op]))]
        for name, t in timings.items():
            bench.add(op=op, impl=name, time=t, bytes=BYTES[op] * n, baseline=baseline, ceiling_gbs=ceiling)

    bench.ceilings["memory (in-place a += b, 12 B/elem), per op"] = " / ".join(f"{c:.1f}" for c in ceilings) + " GB/s"
    bench.note(
        f"GB/s counts the bytes the op must move ({BYTES}). Every op's cases, the memory ceiling (in-place a += b "
        "over 2 x 256 MB) among them, were timed round-robin, so `pct_of_ceiling` compares each with the ceiling "
        "of the same moments. `speedup` is over the first torch row of each op."
    )
    bench.write()


if __name__ == "__main__":
    main()
