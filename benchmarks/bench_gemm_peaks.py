"""The machine's compute peaks and oneDNN's matmul at BERT-base's shapes: what the GEMM ceiling that every other
benchmark prints (torch.mm at 2048^3) is worth against the hardware.

Builds ``benchmarks/native/gemm_peaks.cpp`` with the C++ compiler against the oneDNN ember builds with, runs it
twice, once with OpenMP's threads unbound and once bound to cores (``OMP_PROC_BIND=close OMP_PLACES=cores``, as
``ember-run`` binds them), and writes its records beside torch.mm's ceiling of the same run:

- ``peak``: tile multiplies (AMX) and FMAs (AVX-512, AVX2) with their operands in registers, the best of five runs
  on one thread, on all and on each thread count of the oneDNN runs: the rate no kernel on as many threads passes.
  ``amx_bf16_l1`` reloads its four operand tiles from L1 before every four multiplies, the 2x2 blocking the eight
  tiles allow: the rate of a kernel streaming both operands from L1.
- ``gemm``: oneDNN's matmul on a packed weight, each of BERT-base's four shapes alone in a loop (hot), at 128, 512
  and 2048 rows; ``pct_of_peak`` against the same binding's peak of the dtype (AMX for bf16 where it runs, the
  widest FMA for fp32) on as many threads.
- ``sweep``: BERT-base's 48 GEMMs in a forward's order, each layer its own weights (cold), beside the sum of the
  hot times.

    python benchmarks/bench_gemm_peaks.py [--threads 16,8,1] [--onednn PREFIX]

``--onednn`` names the prefix holding ``include/oneapi/dnnl/dnnl.hpp`` and ``lib/libdnnl.so``; by default the
prefixes of ``CMAKE_PREFIX_PATH`` and this Python's are searched (the ``onednn-devel-cpu-gomp`` wheel installs
there).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
from ember._optimize.api import has_bf16_arithmetic

SOURCE = Path(__file__).resolve().parent / "native" / "gemm_peaks.cpp"
BOUND = {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"}


def find_onednn(explicit: str | None) -> Path:
    """The prefix with oneDNN's headers and library."""
    candidates = [explicit] if explicit else [*os.environ.get("CMAKE_PREFIX_PATH", "").split(":"), sys.prefix]
    for prefix in filter(None, candidates):
        root = Path(prefix)
        if (root / "include/oneapi/dnnl/dnnl.hpp").is_file() and any((root / "lib").glob("libdnnl.so*")):
            return root
    raise SystemExit(
        f"bench_gemm_peaks: no oneDNN (include/oneapi/dnnl/dnnl.hpp and lib/libdnnl.so) under {candidates}; "
        "pass --onednn PREFIX"
    )


def build(onednn: Path, workdir: Path) -> Path:
    compiler = os.environ.get("CXX") or shutil.which("g++") or "c++"
    binary = workdir / "gemm_peaks"
    lib = onednn / "lib"
    # The wheel installs libdnnl.so.3 without the unversioned name a plain -ldnnl looks for.
    library = next(iter(sorted(lib.glob("libdnnl.so*"))))
    command = [compiler, "-O3", "-std=c++17", "-fopenmp", f"-I{onednn / 'include'}", str(SOURCE), "-o", str(binary),
               str(library), f"-Wl,-rpath,{lib}"]  # fmt: skip
    subprocess.run(command, check=True)
    return binary


def parse(line: str, binding: str) -> dict[str, Any] | None:
    fields = line.split()
    if not fields:
        return None
    kind, rest = fields[0], fields[1:]
    if kind == "peak":
        return {"binding": binding, "record": kind, "what": rest[0], "threads": int(rest[1]), "GFLOP_s": float(rest[2])}
    if kind == "gemm":
        dtype, threads, m, k, n, us, gflops = rest
        return {"binding": binding, "record": kind, "what": dtype, "threads": int(threads), "m": int(m), "k": int(k),
                "n": int(n), "time_us": float(us), "GFLOP_s": float(gflops)}  # fmt: skip
    if kind == "sweep":
        dtype, threads, m, cold, hot, gflops = rest
        return {"binding": binding, "record": kind, "what": dtype, "threads": int(threads), "m": int(m),
                "time_us": float(cold) * 1e3, "GFLOP_s": float(gflops), "hot_sum_us": float(hot) * 1e3,
                "cold_over_hot": float(cold) / float(hot)}  # fmt: skip
    return None


def with_peaks(rows: list[dict[str, Any]]) -> None:
    """pct_of_peak for each GEMM row: of its binding's register peak for the dtype (AMX for bf16, the widest FMA for
    fp32) on as many threads."""
    peaks = {(r["binding"], r["what"], r["threads"]): r["GFLOP_s"] for r in rows if r["record"] == "peak"}
    for row in rows:
        if row["record"] == "peak":
            continue
        names = ("amx_bf16",) if row["what"] == "bf16" else ("fp32_fma_avx512", "fp32_fma_avx2")
        peak = next((peaks[key] for n in names if (key := (row["binding"], n, row["threads"])) in peaks), None)
        if peak:
            row["pct_of_peak"] = 100 * row["GFLOP_s"] / peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="", help="thread counts of the oneDNN runs (default: all, then half)")
    parser.add_argument("--onednn", default=None, help="oneDNN's prefix (include/, lib/)")
    args = parser.parse_args()
    bench = harness.Benchmark("gemm_peaks", "Compute peaks and oneDNN's matmul at BERT-base's shapes")
    dtypes = (torch.float32, torch.bfloat16) if has_bf16_arithmetic() else (torch.float32,)  # (bf16: minutes elsewhere)
    bench.gemm_ceiling(dtypes=dtypes, min_time=0.5)
    onednn = find_onednn(args.onednn)
    threads = [t for t in args.threads.split(",") if t]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as workdir:
        binary = build(onednn, Path(workdir))
        for binding, extra in (("unbound", {}), ("cores", BOUND)):
            env = {k: v for k, v in os.environ.items() if k not in BOUND} | extra
            out = subprocess.run([str(binary), *threads], check=True, capture_output=True, text=True, env=env).stdout
            rows += [row for row in (parse(line, binding) for line in out.splitlines()) if row]
    with_peaks(rows)
    for row in rows:
        bench.record(row)
    bench.note(f"oneDNN from {onednn}; torch.mm's ceiling runs on torch's own GEMM (MKL or oneDNN).")
    bench.write()


if __name__ == "__main__":
    main()
