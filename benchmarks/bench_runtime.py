"""Inference throughput by layout: one untuned process against ember-run instances and MultiStreamModule streams.

Every candidate runs the same bf16 model (ResNet-50 at 224x224, BERT-base at 128 tokens; see bench_inference.py)
on all the CPUs this process may use, at batch 1 (and the other --batches) per instance or stream:

- "untuned process": ``python`` with no launcher, torch's default threads (every core) and glibc malloc; once
  with torch eager under bf16 autocast, once with ``ember.optimize(model, dtype=torch.bfloat16)``;
- "ember-run NxK": ``ember-run --ninstances N --ncores-per-instance K`` with each allocator, every instance its own
  process running ember's model;
- "streams NxK": one ember-run instance on all cores, the model wrapped in
  ``ember.runtime.MultiStreamModule(model, num_streams=N)``, fed N x batch samples a call.

Instances warm up, wait for each other at a file barrier, then count the samples they finish in --seconds; a
layout's throughput is the sum over its instances. Speed-ups are against the untuned process running ember's model
and against the untuned process running torch eager.

    python benchmarks/bench_runtime.py [--models resnet50,bert] [--layouts 1x16,4x4,16x1]
                                       [--allocators default,jemalloc] [--batches 1] [--seconds 8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_inference
import ember
import harness
from ember.runtime import MultiStreamModule

HERE = Path(__file__).resolve()


# --- the worker: one instance ---------------------------------------------------------------------------------------


def wait_for_parties(barrier: str, parties: int, timeout: float = 600.0) -> None:
    Path(barrier, f"ready-{os.getpid()}").touch()
    deadline = time.monotonic() + timeout
    while len(list(Path(barrier).glob("ready-*"))) < parties:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(list(Path(barrier).glob('ready-*')))} of {parties} instances got ready")
        time.sleep(0.01)


def worker(args: argparse.Namespace) -> None:
    model, make_input, _ = bench_inference.build(args.model)
    streams = args.streams
    if args.impl == "torch":
        run = bench_inference.eager(model, torch.bfloat16)
    else:
        run = ember.optimize(model, dtype=torch.bfloat16)
        if streams:
            run = MultiStreamModule(run, num_streams=streams)
    per_call = args.batch * (streams or 1)
    x = make_input(per_call)
    with torch.inference_mode():
        warm_until = time.monotonic() + args.warmup
        while time.monotonic() < warm_until:
            run(x)
        wait_for_parties(args.barrier, args.parties)
        latencies = []
        start = time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            t0 = time.perf_counter()
            run(x)
            latencies.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - start
    latencies.sort()
    print("RESULT " + json.dumps({"items_per_s": per_call * len(latencies) / elapsed,
                                  "median_ms": 1e3 * latencies[len(latencies) // 2],
                                  "threads": torch.get_num_threads()}), flush=True)  # fmt: skip


# --- the driver -----------------------------------------------------------------------------------------------------


def launch(prefix: list[str], model: str, impl: str, batch: int, parties: int, args: argparse.Namespace,
           streams: int = 0) -> list[dict]:  # fmt: skip
    """Runs the worker under `prefix` (ember-run and its options, or nothing) and returns each instance's result."""
    with tempfile.TemporaryDirectory() as barrier:
        worker_args = ["--worker", "--model", model, "--impl", impl, "--batch", str(batch), "--barrier", barrier,
                       "--parties", str(parties), "--seconds", str(args.seconds), "--warmup", str(args.warmup),
                       "--streams", str(streams)]  # fmt: skip
        run = subprocess.run([*prefix, str(HERE), *worker_args], capture_output=True, text=True, timeout=900)
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in run.stdout.splitlines() if "RESULT " in line]
    if run.returncode != 0 or len(results) != parties:
        raise RuntimeError(f"{' '.join(prefix)} failed ({run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet50,bert")
    parser.add_argument("--layouts", default="", help="NxK instance layouts (default: 1xP, 4x(P/4), Px1)")
    parser.add_argument("--allocators", default="default,jemalloc")
    parser.add_argument("--batches", default="1")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--impl", default="ember", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--barrier", help=argparse.SUPPRESS)
    parser.add_argument("--parties", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--streams", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    cores = len(ember.runtime.CPUPool())
    layouts = args.layouts.split(",") if args.layouts else sorted({f"1x{cores}", f"4x{cores // 4}", f"{cores}x1"})
    layouts = [tuple(int(v) for v in layout.split("x")) for layout in layouts if int(layout.split("x")[1]) > 0]
    bench = harness.Benchmark("runtime", "Inference throughput by layout: untuned process, ember-run, streams")
    ember_run = [sys.executable, "-m", "ember.launch"]
    for model in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            case = {"model": model, "batch": batch}

            def add(config: str, allocator: str, results: list[dict], untuned: dict | None, case=case) -> dict:
                total = {"items_per_s": sum(r["items_per_s"] for r in results),
                         "median_ms": max(r["median_ms"] for r in results)}  # fmt: skip
                row = {**case, "config": config, "allocator": allocator, "items_per_s": total["items_per_s"],
                       "median_ms": total["median_ms"]}  # fmt: skip
                if untuned:
                    row["vs_untuned_ember"] = total["items_per_s"] / untuned["ember"]
                    row["vs_untuned_torch"] = total["items_per_s"] / untuned["torch"]
                bench.record(row)
                return total

            untuned = {}
            plain = [sys.executable]
            untuned["torch"] = add("untuned process, torch eager autocast", "default",
                                   launch(plain, model, "torch", batch, 1, args), None)["items_per_s"]  # fmt: skip
            untuned["ember"] = add("untuned process, ember", "default",
                                   launch(plain, model, "ember", batch, 1, args), None)["items_per_s"]  # fmt: skip
            for allocator in args.allocators.split(","):
                for n, k in layouts:
                    options = ["--ninstances", str(n), "--ncores-per-instance", str(k), "--memory-allocator", allocator]
                    add(f"ember-run {n}x{k}", allocator, launch([*ember_run, *options], model, "ember", batch, n, args),
                        untuned)  # fmt: skip
                for n, k in layouts:
                    options = [
                        "--ninstances",
                        "1",
                        "--ncores-per-instance",
                        str(n * k),
                        "--memory-allocator",
                        allocator,
                    ]
                    add(f"streams {n}x{k}", allocator,
                        launch([*ember_run, *options], model, "ember", batch, 1, args, streams=n), untuned)  # fmt: skip
            bench.write()  # after every model and batch, so a run cut short keeps what it measured
    bench.note(f"Each figure: samples finished in {args.seconds:g} s after {args.warmup:g} s of warm-up, summed over "
               "the instances, which start measuring together (a file barrier). median_ms: the slowest instance's "
               "median call (a streams call carries one batch per stream).")  # fmt: skip
    bench.write()


if __name__ == "__main__":
    main()
