"""The graph-mode issue's goals against the measurements in benchmarks/results/: one table, computed, nothing typed in.

    python benchmarks/models_goals.py [--out benchmarks/results/models-goals.md]

Reads every results file of bench_models.py (the latest run of each model, dtype, batch and candidate, as
plot_models.py draws them) and of bench_vs_ipex.py, and writes each goal beside what the files hold. A ratio between
two candidates (graph mode against Inductor, against the module rewrite, bf16 against the fp32 model) is taken within
one run only, since the hosts drift between runs (their spreads are in the files). Machines: the 16-core Xeon with AMX
(the headline), the 2-core Zen 5 with AVX512-BF16 and no AMX, the 2-core Sapphire Rapids (IPEX runs). Beside the
goals, with model_flops.py's counts: the speedup over eager each run's GEMM ceiling allows, and how close graph mode
runs to that ceiling.
"""

from __future__ import annotations

import argparse
import csv
import re
from collections.abc import Iterable
from pathlib import Path

from plot_models import RESULTS, geometric_mean, latest_rows, measured_at, results_files

XEON, ZEN5 = "intel-amx-16c-torch2", "amd-avx512_bf16-2c-torch2"
# The convolutional networks of bench_models' list; every other model there is a transformer.
CONVOLUTIONAL = {
    "resnet50", "mobilenet_v3", "efficientnet_b0", "convnext_t", "resnext50", "mobilenet_v2", "efficientnet_v2_s",
    "regnet_y_400mf", "densenet121", "detection_backbone",
}  # fmt: skip
GRAPH, MODULES, INDUCTOR = "ember graph", "ember modules", "compile inductor"

Row = dict[str, str]


def _runs(machine: str) -> Iterable[list[Row]]:
    """Each bench_models run of ``machine``, oldest first, as its rows."""
    for path in results_files(machine):
        with path.open(newline="") as f:
            yield list(csv.DictReader(f))


def _same_run_ratios(machine: str, dtype: str, over: str) -> dict[tuple[str, str], float]:
    """(model, batch) -> graph mode's time over ``over``'s as a speedup, from the latest run that measured both."""
    ratios = {}
    for rows in _runs(machine):
        times = {(r["model"], r["batch"], r["impl"]): float(r["median_us"]) for r in rows if r["dtype"] == dtype}
        for (model, batch, impl), graph in times.items():
            if impl == GRAPH and (model, batch, over) in times:
                ratios[(model, batch)] = times[(model, batch, over)] / graph
    return ratios


def _speedups(machine: str, dtype: str, batch: str, impl: str = GRAPH) -> dict[str, float]:
    rows = latest_rows(machine)
    return {m: float(r["speedup"]) for (m, d, b, i), r in rows.items() if d == dtype and b == batch and i == impl}


def _listed(values: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.2f}x" for name, value in sorted(values.items(), key=lambda kv: kv[1])) or "none"


def _vs_ipex() -> dict[tuple[str, str, str, str], float]:
    """(machine, model, dtype, batch) -> ember graph over IPEX, each from the latest run that measured it."""
    found = {}
    for path in sorted(RESULTS.glob("vs_ipex-*.csv"), key=measured_at):
        machine = "Sapphire Rapids, AMX" if "intel-amx-2c" in path.stem else "Zen 5"
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                if row["impl"] == GRAPH:
                    found[(machine, row["model"], row["dtype"], row["batch"])] = float(row["vs_ipex"])
    return found


def _new_batch_costs(machine: str) -> dict[str, float]:
    """'model at batch N' -> what graph mode's first call at that new batch size cost beyond a warm call, from the
    latest bench_new_batch.py run that measured it."""
    costs = {}
    files = [p for p in RESULTS.glob(f"new_batch-*{machine}.csv") if p.stem.endswith(machine)]
    for path in sorted(files, key=measured_at):
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                if row["impl"] == GRAPH:
                    costs[f"{row['model']} at batch {row['batch']}"] = float(row["extra_s"])
    return costs


def goals() -> list[tuple[str, str, str]]:
    """(goal, where it stands, met?) for each goal of the issue that the results files measure."""
    table = []
    for batch, goal in (("1", 3.5), ("16", 2.5)):
        s = _speedups(XEON, "bfloat16", batch)
        mean = geometric_mean(list(s.values()))
        table.append((f"bf16 geometric mean >= {goal}x eager autocast at batch {batch} (Xeon)",
                      f"{mean:.2f}x over {len(s)} models", "yes" if mean >= goal else "no"))  # fmt: skip
    s = _speedups(XEON, "bfloat16", "1")
    short = {m: v for m, v in s.items() if m not in CONVOLUTIONAL and v < 2.5}
    table.append(("every transformer >= 2.5x eager autocast at batch 1 (Xeon)",
                  f"below: {_listed(short)}", "no" if short else "yes"))  # fmt: skip
    inductor = _same_run_ratios(XEON, "bfloat16", INDUCTOR)
    allowed = inductor_allowances()
    below = {f"{m} b{b}": v for (m, b), v in inductor.items() if v < 1.5}
    beyond = {f"{m} b{b}": v for (m, b), v in allowed.items() if v < 1.5 and f"{m} b{b}" in below}
    table.append(("bf16 >= 1.5x torch.compile (Inductor) at batch 1 and 16 (Xeon, same run)",
                  f"{len(inductor)} measured; below: {_listed(below)}; of these, where the run's GEMM ceiling allows"
                  f" less than 1.5x over Inductor: {_listed(beyond)}", "no" if below else "yes"))  # fmt: skip
    slower = {f"{m} b{b}": v for b in ("1", "16") for m, v in _speedups(XEON, "bfloat16", b).items() if v < 1}
    modules = {f"{m} b{b}": v for (m, b), v in _same_run_ratios(XEON, "bfloat16", MODULES).items() if v < 1}
    table.append(("no model slower than eager autocast or than the module rewrite (Xeon, bf16)",
                  f"slower than eager: {_listed(slower)}; than the module rewrite: {_listed(modules)}",
                  "no" if slower or modules else "yes"))  # fmt: skip
    fp32 = _speedups(XEON, "float32", "1")
    mean = geometric_mean(list(fp32.values()))
    table.append(("fp32 geometric mean >= 1.5x eager at batch 1 (Xeon)", f"{mean:.2f}x over {len(fp32)} models",
                  "yes" if mean >= 1.5 else "no"))  # fmt: skip
    setups = {r["model"]: float(r["setup_s"]) for rows in _runs(XEON) for r in rows if r["impl"] == GRAPH}  # latest
    over = {m: v for m, v in setups.items() if v >= 10}
    table.append(("ember.optimize under 10 s for every model (Xeon)",
                  f"slowest {max(setups.values()):.1f} s; at or over 10 s: {', '.join(over) or 'none'}",
                  "no" if over else "yes"))  # fmt: skip
    goal = "a new batch size's first call under 1 s beyond a warm call (graph mode, Xeon)"
    first_calls = _new_batch_costs(XEON)
    if first_calls:
        over = {k: v for k, v in first_calls.items() if v >= 1}
        slowest = max(first_calls, key=first_calls.__getitem__)
        table.append((goal, f"{len(first_calls)} measured, slowest {slowest} {first_calls[slowest]:.2f} s; at or "
                      f"over 1 s: {', '.join(over) or 'none'}", "no" if over else "yes"))  # fmt: skip
    else:
        table.append((goal, "not measured (benchmarks/bench_new_batch.py)", "no"))
    fp32_model = _same_run_ratios(ZEN5, "bfloat16", "torch eager fp32")
    slower = {f"{m} b{b}": v for (m, b), v in fp32_model.items() if v < 1}
    table.append(("without AMX, ember's bf16 never slower than the fp32 model (Zen 5, AVX512-BF16)",
                  f"{len(fp32_model)} measured, lowest {min(fp32_model.values()):.2f}x; slower: {_listed(slower)}",
                  "no" if slower else "yes"))  # fmt: skip
    ipex = _vs_ipex()
    short = {f"{m} {d} b{b} ({machine})": v for (machine, m, d, b), v in ipex.items() if v < 1.2}
    table.append((">= 1.2x IPEX's traced-and-frozen path on ResNet-50 and BERT-base (2-core machines)",
                  f"{len(ipex)} measured; below: {_listed(short)}", "no" if short else "yes"))  # fmt: skip
    return table


def _ceilings_by_run(machine: str, dtype: str) -> Iterable[tuple[float, list[Row]]]:
    """Each run of ``machine`` that states its GEMM ceiling in ``dtype`` (GFLOP/s), with its rows, oldest first."""
    pattern = re.compile(rf"ceiling: GEMM {dtype} \(torch\.mm\) \| ([0-9.]+) GFLOP/s")
    for path in results_files(machine):
        found = pattern.search(path.with_suffix(".md").read_text())
        if found:
            with path.open(newline="") as f:
                yield float(found.group(1)), list(csv.DictReader(f))


def ceiling_bounds(machine: str = XEON, dtype: str = "bfloat16") -> dict[tuple[str, str], tuple[float, float, float]]:
    """(model, batch) -> (the least time one forward takes at the run's GEMM ceiling in ms, eager's time over it: the
    largest speedup over eager that ceiling allows, graph mode's share of the ceiling), from the latest run measuring
    eager and graph mode, with model_flops.py's counts."""
    gflop = _model_gflop()
    eager = "torch eager"
    bounds = {}
    for ceiling, rows in _ceilings_by_run(machine, dtype):
        times = {(r["model"], r["batch"], r["impl"]): float(r["median_us"]) for r in rows if r["dtype"] == dtype}
        for (model, batch, impl), graph in times.items():
            if impl != GRAPH or (model, batch, eager) not in times or (model, batch) not in gflop:
                continue
            at_ceiling_us = gflop[(model, batch)] / ceiling * 1e6
            bounds[(model, batch)] = (at_ceiling_us / 1e3, times[(model, batch, eager)] / at_ceiling_us,
                                      at_ceiling_us / graph)  # fmt: skip
    return bounds


def inductor_allowances(machine: str = XEON, dtype: str = "bfloat16") -> dict[tuple[str, str], float]:
    """(model, batch) -> Inductor's time over the least time the run's GEMM ceiling allows a forward: the largest
    speedup over Inductor any implementation could show in that run, from the latest run measuring Inductor."""
    gflop = _model_gflop()
    allowed = {}
    for ceiling, rows in _ceilings_by_run(machine, dtype):
        for r in rows:
            key = (r["model"], r["batch"])
            if r["dtype"] == dtype and r["impl"] == INDUCTOR and key in gflop:
                allowed[key] = float(r["median_us"]) / (gflop[key] / ceiling * 1e6)
    return allowed


def _model_gflop() -> dict[tuple[str, str], float]:
    flops_file = RESULTS / "model-flops.csv"
    if not flops_file.exists():
        return {}
    with flops_file.open(newline="") as f:
        return {(r["model"], r["batch"]): float(r["gflop"]) for r in csv.DictReader(f)}


def _bounds_table() -> list[str]:
    bounds = ceiling_bounds()
    if not bounds:
        return []
    lines = [
        "",
        "## What the same run's GEMM ceiling allows (Xeon, bf16)",
        "",
        "A forward's matrix products, convolutions and attention (`model-flops.csv`, `benchmarks/model_flops.py`) take"
        " at least their count over the run's torch.mm rate (n = 2048): eager autocast's time over that is the largest"
        " speedup over eager the rate allows (the bound), and that time over graph mode's is graph mode's share of the"
        " ceiling. Depthwise and small convolutions (MobileNets, EfficientNets, RegNet) run far below a GEMM's rate on"
        " any implementation: for them the bound is loose.",
        "",
        "| batch | geometric mean of the bound | models whose bound is under 2.5x | graph mode's share of the ceiling"
        " |",
        "|---|---|---|---|",
    ]
    for batch in ("1", "16"):
        at = {m: v for (m, b), v in bounds.items() if b == batch}
        if not at:
            continue
        mean = geometric_mean([v[1] for v in at.values()])
        under = {m: v[1] for m, v in at.items() if v[1] < 2.5}
        share = ", ".join(f"{m} {v[2]:.0%}" for m, v in sorted(at.items(), key=lambda kv: kv[1][2]))
        lines.append(f"| {batch} | {mean:.2f}x over {len(at)} models | {_listed(under)} | {share} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=RESULTS / "models-goals.md")
    args = parser.parse_args()
    lines = [
        "# Graph mode: the issue's goals against the results files",
        "",
        "Written by `benchmarks/models_goals.py` from `benchmarks/results/` (the latest run of each row; ratios between"
        " two candidates from one run). docs/benchmarks.md explains the runs and the bounds.",
        "",
        "| goal | measured | met |",
        "|---|---|---|",
        *(f"| {goal} | {where} | {met} |" for goal, where, met in goals()),
        *_bounds_table(),
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
