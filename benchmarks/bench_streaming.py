"""Where ember's kernels switch to streaming (non-temporal) stores: bf16 round across sizes around the threshold.

Kernels stream their outputs when a call moves more bytes than ember.\\_C.stream_threshold_bytes(), by default the
cache the process's first CPU shares (sysfs). Each size runs the same ember.bf16.round four ways in one interleaved
round: at the default threshold, never streaming, always streaming, and torch's ``x.to(torch.bfloat16, out)``
copy. Above the cache size the output cannot stay cached for whoever reads it next, and streaming should win;
below it this loop still favours streaming (nothing here reads the output back), which the threshold deliberately
forgoes so that a consumer finds the output in cache.

    python benchmarks/bench_streaming.py [--sizes 1,4,8,16,32,64]   (millions of float32 elements)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ember
import harness
from ember import _C

NEVER = 2**62


def with_threshold(threshold: int, x: torch.Tensor, out: torch.Tensor) -> Callable[[], None]:
    def call() -> None:
        _C.set_stream_threshold_bytes(threshold)
        ember.bf16.round(x, out=out)

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,4,8,16,32,64", help="millions (2^20) of float32 elements")
    parser.add_argument("--min-time", type=float, default=2.0)
    args = parser.parse_args()

    default = _C.stream_threshold_bytes()
    bench = harness.Benchmark("streaming", "Streaming-store threshold: bf16 round across sizes")
    bench.stream_ceiling()
    bench.note(f"Default threshold {default / 2**20:.0f} MiB moved (6 bytes an element for round).")
    gen = torch.Generator().manual_seed(0)
    try:
        for millions in (int(s) for s in args.sizes.split(",")):
            n = millions * 2**20
            x = torch.randn(n, generator=gen)
            out = torch.empty(n, dtype=torch.bfloat16)
            cases = {
                "torch x.to(bf16)": lambda x=x, out=out: out.copy_(x),
                "ember, default threshold": with_threshold(default, x, out),
                "ember, never streaming": with_threshold(NEVER, x, out),
                "ember, always streaming": with_threshold(0, x, out),
            }
            times = bench.interleaved(cases, min_time=args.min_time)
            streams = 6 * n > default
            for impl, t in times.items():
                bench.add(elements_M=millions, MiB_moved=6 * millions, impl=impl, default_streams=streams, time=t,
                          bytes=6 * n, baseline=times["torch x.to(bf16)"])  # fmt: skip
    finally:
        _C.set_stream_threshold_bytes(default)
    bench.note("speedup is over torch's copy into the same bf16 tensor; GB/s counts 6 bytes an element.")
    bench.write()


if __name__ == "__main__":
    main()
