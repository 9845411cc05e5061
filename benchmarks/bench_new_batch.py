"""The first call at a new batch size: what graph mode (``ember.optimize(..., graph_mode=True)``) and
``torch.compile(backend="ember")`` spend on it beyond a warm call of that size.

Graph mode captures once, with symbolic sizes where the capture records them, so a new batch size re-captures
nothing: its first call builds the oneDNN primitives for the new row counts, packs nothing again, and records the
replayed segments for the new input signature. torch.compile's first call at a second batch size re-traces the model
through dynamo (which then marks the batch dynamic) and hands ember a new graph, so that the third size compiles
nothing. For each model, after the optimized model has run warm at batch 1: the first call at each size of
``--batches`` in turn, then the median of ``--repeats`` more calls at that size (``steady_s``); ``extra_s`` is the
difference, the cost of the new size (the graph-mode issue's goal: under 1 s).

    python benchmarks/bench_new_batch.py [--models bert,resnet50,...|all] [--batches 16,8] [--dtype bfloat16]
                                         [--compile] [--part NAME]

Models are bench_models.py's (random weights, built from their configs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_models
import ember
import harness


def _timed(fn: Callable[[dict[str, Any]], Any], inputs: dict[str, Any]) -> float:
    start = time.perf_counter()
    fn(inputs)
    return time.perf_counter() - start


def measure(fn: Callable[[dict[str, Any]], Any], make_inputs: Callable[[int], dict[str, Any]], batches: list[int],
            repeats: int) -> list[tuple[int, float, float]]:  # fmt: skip
    """(batch, first call's seconds, median of the next calls' seconds) for each new batch size in turn, after
    warm calls at batch 1."""
    warm = make_inputs(1)
    for _ in range(3):
        fn(warm)
    rows = []
    for batch in batches:
        inputs = make_inputs(batch)
        first = _timed(fn, inputs)
        steady = statistics.median(_timed(fn, inputs) for _ in range(repeats))
        rows.append((batch, first, steady))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(bench_models.DEFAULT), help="comma-separated, or 'all'")
    parser.add_argument("--batches", default="16,8", help="new batch sizes, in the order they are first called")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help='also torch.compile(backend="ember")')
    parser.add_argument(
        "--part", default="", help="a name for a run of a subset: results/new_batch-<part>-<machine>.md"
    )
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    batches = [int(b) for b in args.batches.split(",")]
    names = bench_models.ALL if args.models == "all" else tuple(args.models.split(","))
    bench = harness.Benchmark("new_batch", "The first call at a new batch size", part=args.part)
    for name in names:
        model, make_inputs = bench_models.build(name)
        sample = make_inputs(1)
        candidates: dict[str, Callable[[dict[str, Any]], Any]] = {}
        start = time.perf_counter()
        graph = ember.optimize(model, dtype=dtype, graph_mode=True, sample_input=sample)
        setup = {"ember graph": time.perf_counter() - start}
        candidates["ember graph"] = lambda inputs, fn=graph: bench_models.call(fn, inputs)
        path = bench_models.ember_graph_path(graph)
        if args.compile:
            torch._dynamo.reset()
            compiled = bench_models.under(dtype, torch.compile(model, backend="ember"))
            candidates["compile ember"] = lambda inputs, fn=compiled: bench_models.call(fn, inputs)
        for impl, fn in candidates.items():
            with torch.inference_mode():
                start = time.perf_counter()
                fn(sample)  # (torch.compile compiles here)
                first_at_1 = time.perf_counter() - start
                rows = measure(fn, make_inputs, batches, args.repeats)
            for batch, first, steady in rows:
                bench.record({
                    "model": name, "dtype": args.dtype, "impl": impl, "batch": batch, "first_s": first,
                    "steady_s": steady, "extra_s": first - steady,
                    "setup_s": setup.get(impl, first_at_1),
                })  # fmt: skip
        bench.note(f"{name}: graph mode: {path}")
        bench.write()  # after each model: a run cut short keeps what it measured


if __name__ == "__main__":
    main()
