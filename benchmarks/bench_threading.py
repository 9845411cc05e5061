"""Which thread pool should run ember's own parallel loops: oneTBB or OpenMP? (issue 2, item 7)

torch runs its intra-op parallelism on OpenMP; oneDNN (the PyPI build ember uses) too, sharing torch's libgomp.
ember's loops can run on either backend of csrc/core/parallel.cpp, switched at run time, so both are measured in
one process on the same inputs:
  - alone: ember.bf16.round(x, out=o) back to back;
  - interleaved: a training-step-like loop that alternates a torch op (torch.add(a, b, out=c), parallel on
    torch's OpenMP pool) and an ember op (bf16.round), where two pools hand the cores back and forth. OpenMP
    workers spin after a parallel region (GOMP_SPINCOUNT), TBB workers spin too; the cost of switching pools
    is what this case exposes;
  - the torch op alone, so that interleaved - (torch alone + ember alone) is the penalty of alternating.

    python benchmarks/bench_threading.py [--sizes 65536 1048576 16777216]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ember
import harness
from ember import _C


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2**16, 2**20, 2**24])
    args = parser.parse_args()
    if not _C.openmp_available():
        sys.exit("this build of ember has no OpenMP backend (EMBER_WITH_OPENMP=OFF): nothing to compare")

    bench = harness.Benchmark("threading", "ember's parallel loops: oneTBB vs OpenMP, alone and beside torch ops")
    bench.stream_ceiling()
    saved = _C.threading_backend()
    try:
        for n in args.sizes:
            x = torch.randn(n)
            o = torch.empty(n, dtype=torch.bfloat16)
            a, b, c = torch.randn(n), torch.randn(n), torch.empty(n)

            def ember_op(x=x, o=o) -> None:
                ember.bf16.round(x, out=o)

            def torch_op(a=a, b=b, c=c) -> None:
                torch.add(a, b, out=c)

            def interleaved(c=c, o=o, torch_op=torch_op) -> None:
                torch_op()
                ember.bf16.round(c, out=o)

            t_torch = bench.time(torch_op)
            bench.add(case="torch op alone", elements=n, backend="(torch OpenMP)", time=t_torch, bytes=12 * n)
            results = {}
            for backend in ("tbb", "openmp"):
                _C.set_threading_backend(backend)
                results[backend] = (bench.time(ember_op), bench.time(interleaved))
            for backend, (t_alone, t_mixed) in results.items():
                tbb_alone, tbb_mixed = results["tbb"]
                bench.add(case="ember op alone", elements=n, backend=backend, time=t_alone, bytes=6 * n,
                          baseline=tbb_alone)  # fmt: skip
                penalty = t_mixed.median - t_alone.median - t_torch.median
                bench.add(
                    case="torch op + ember op",
                    elements=n,
                    backend=backend,
                    time=t_mixed,
                    bytes=18 * n,
                    baseline=tbb_mixed,
                    penalty_us=1e6 * penalty,
                )
    finally:
        _C.set_threading_backend(saved)

    bench.note("`speedup` is over the tbb row of the same case and size (above 1: faster than oneTBB). "
               "`penalty_us` = interleaved - (torch alone + ember alone): the cost of alternating pools. "
               f"Threads: {torch.get_num_threads()} for torch and ember alike.")  # fmt: skip
    bench.write()


if __name__ == "__main__":
    main()
