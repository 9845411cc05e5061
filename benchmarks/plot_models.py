"""The graph-mode benchmark's picture: each model's speedup over torch eager, one machine, one dtype.

    python benchmarks/plot_models.py [--machine intel-amx-16c-torch2] [--dtype bfloat16] [--out PATH]

Reads every results file bench_models.py wrote for the machine (``models-<machine>.csv`` and the parts of a list
measured in several runs, ``models-<part>-<machine>.csv``). Where two runs measured the same model, dtype, batch and
candidate, the later run's row is drawn. Each bar is a ratio measured in one run against eager in the same run:
eager with bf16 autocast for bfloat16, the fp32 model for float32. The geometric mean of each candidate over the
models drawn is in its legend. Nothing is typed in here.
"""

from __future__ import annotations

import argparse
import csv
import math
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server
import matplotlib.pyplot as plt

RESULTS = Path(__file__).resolve().parent / "results"
DOCS_STATIC = Path(__file__).resolve().parent.parent / "docs" / "_static"
CANDIDATES = {  # drawn, in this order, with these colours
    "ember graph": "#d9480f",
    "compile ember": "#f59f00",
    "compile inductor": "#868e96",
}
_MEASURED = re.compile(r"Measured (\d{4}-\d\d-\d\d \d\d:\d\d) UTC")


def measured_at(csv_path: Path) -> str:
    """When the run that wrote ``csv_path`` started, from its markdown twin ('' if it says nothing)."""
    md = csv_path.with_suffix(".md")
    found = _MEASURED.search(md.read_text()) if md.exists() else None
    return found.group(1) if found else ""


def results_files(machine: str) -> list[Path]:
    """bench_models' CSV files of ``machine``, oldest run first."""
    files = [p for p in RESULTS.glob(f"models-*{machine}.csv") if p.stem.endswith(machine)]
    return sorted(files, key=measured_at)


def latest_rows(machine: str) -> dict[tuple[str, str, str, str], dict[str, str]]:
    """Every (model, dtype, batch, impl) the machine's results hold, each from the latest run that measured it."""
    rows: dict[tuple[str, str, str, str], dict[str, str]] = {}
    for path in results_files(machine):
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                rows[(row["model"], row["dtype"], row["batch"], row["impl"])] = row
    return rows


def geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def plot(machine: str, dtype: str, out: Path) -> None:
    rows = latest_rows(machine)
    batches = sorted({int(b) for (_, d, b, _) in rows if d == dtype})
    if not batches:
        raise SystemExit(f"plot_models: no {dtype} results for {machine} in {RESULTS}")
    models = list(dict.fromkeys(m for (m, d, _, _) in rows if d == dtype))
    fig, axes = plt.subplots(len(batches), 1, figsize=(max(9.0, 0.42 * len(models)), 3.4 * len(batches)), dpi=110)
    axes = axes if len(batches) > 1 else [axes]
    for ax, batch in zip(axes, batches):
        present = [c for c in CANDIDATES if any((m, dtype, str(batch), c) in rows for m in models)]
        width = 0.8 / max(len(present), 1)
        tallest = 1.0
        for i, impl in enumerate(present):
            xs, ys = [], []
            for j, model in enumerate(models):
                row = rows.get((model, dtype, str(batch), impl))
                if row is not None and row["speedup"]:
                    xs.append(j + (i - (len(present) - 1) / 2) * width)
                    ys.append(float(row["speedup"]))
            label = f"{impl} (geomean {geometric_mean(ys):.2f}x over {len(ys)})" if ys else impl
            ax.bar(xs, ys, width, color=CANDIDATES[impl], label=label)
            tallest = max([tallest, *ys])
        ax.axhline(1.0, color="#212529", linewidth=0.8)
        ax.set_xticks(range(len(models)))
        ax.set_xticklabels(models, rotation=60, ha="right", fontsize=8)
        ax.set_ylabel(f"x eager, batch {batch}")
        ax.set_ylim(0, tallest * 1.25)  # room for the legend above the bars
        ax.legend(fontsize=8, loc="upper center", ncol=len(present), frameon=False)
        ax.spines[["top", "right"]].set_visible(False)
    baseline = "eager with bf16 autocast" if dtype == "bfloat16" else f"eager {dtype}"
    axes[0].set_title(f"{dtype} on {machine}: speedup over {baseline} (benchmarks/bench_models.py)", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--machine", default="intel-amx-16c-torch2")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", type=Path, default=None, help="default: docs/_static/models-<machine>-<dtype>.png")
    args = parser.parse_args()
    plot(args.machine, args.dtype, args.out or DOCS_STATIC / f"models-{args.machine}-{args.dtype}.png")


if __name__ == "__main__":
    main()
