"""What ember-run's own settings cost or gain, one setting at a time, in interleaved rounds.

bench_runtime.py compares layouts once each; on a shared machine one run of one layout can be 10% off. This runs
the same bf16 inference worker (bench_runtime.py's: ResNet-50 or BERT-base at batch 1, ember's model) under:

- "untuned": ``python`` alone (torch's threads on every core, glibc malloc);
- "ember-run 1xP": one instance on all P cores, glibc malloc and jemalloc, each with OpenMP binding
  (OMP_PLACES + OMP_PROC_BIND=close, the default) and with ``--no-omp-binding``;
- "ember-run 4x(P/4)": four instances, jemalloc, with and without OpenMP binding;

round after round, so that drift in the machine's speed hits every configuration alike, and reports each
configuration's median and range over the rounds.

    python benchmarks/bench_instance_settings.py [--models resnet50,bert] [--rounds 3] [--seconds 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_runtime
import ember
import harness


def configurations(cores: int) -> list[tuple[str, list[str] | None, int]]:
    """(label, ember-run options or None for the untuned process, instances)."""
    one = ["--ninstances", "1", "--ncores-per-instance", str(cores)]
    four = ["--ninstances", "4", "--ncores-per-instance", str(cores // 4)]
    found: list[tuple[str, list[str] | None, int]] = [("untuned process", None, 1)]
    for allocator in ("default", "jemalloc"):
        for binding in ([], ["--no-omp-binding"]):
            label = f"ember-run 1x{cores} {allocator}" + (" unbound" if binding else "")
            found.append((label, [*one, "--memory-allocator", allocator, *binding], 1))
    if cores >= 8:
        for binding in ([], ["--no-omp-binding"]):
            label = f"ember-run 4x{cores // 4} jemalloc" + (" unbound" if binding else "")
            found.append((label, [*four, "--memory-allocator", "jemalloc", *binding], 4))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet50,bert")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    args = parser.parse_args()

    cores = len(ember.runtime.CPUPool())
    bench = harness.Benchmark("instance_settings", "ember-run's settings one at a time, interleaved rounds")
    ember_run = [sys.executable, "-m", "ember.launch"]
    for model in args.models.split(","):
        configs = configurations(cores)
        seen: dict[str, list[float]] = {label: [] for label, _, _ in configs}
        for _ in range(args.rounds):
            for label, options, parties in configs:
                prefix = [sys.executable] if options is None else [*ember_run, *options]
                results = bench_runtime.launch(prefix, model, "ember", 1, parties, args)
                seen[label].append(sum(r["items_per_s"] for r in results))
        untuned = statistics.median(seen["untuned process"])
        for label, runs in seen.items():
            median = statistics.median(runs)
            bench.record({"model": model, "batch": 1, "config": label, "median_items_per_s": median,
                          "min": min(runs), "max": max(runs), "vs_untuned": median / untuned})  # fmt: skip
        bench.write()  # after every model, so a run cut short keeps what it measured
    bench.note(f"Each run: samples finished in {args.seconds:g} s after {args.warmup:g} s of warm-up, summed over the "
               f"instances; {args.rounds} rounds, every configuration once a round. min/max: the range over the "
               "rounds; vs_untuned: medians' ratio.")  # fmt: skip
    bench.write()


if __name__ == "__main__":
    main()
