"""The README's picture: ember's end-to-end speedups per model, read from the results files of one machine.

    python benchmarks/plot_speedups.py [--machine intel-amx-16c-torch2] [--out docs/_static/speedups.png]

Each bar is a ratio a benchmark measured in one run against stock PyTorch in bf16 (autocast) on the same machine:
bench_inference.py (ember.optimize(model.eval()) and torch.compile against eager) and bench_training.py (a training
step of ember.optimize(model, optimizer) against autocast with torch's fused AdamW). Nothing is typed in here.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server
import matplotlib.pyplot as plt

RESULTS = Path(__file__).resolve().parent / "results"
MODEL_NAMES = {"resnet50": "ResNet-50", "bert": "BERT-base", "bert-base": "BERT-base"}


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def inference_bars(machine: str) -> list[tuple[str, str, float]]:
    """(workload, implementation, speedup over eager bf16) for each bf16 row of bench_inference's results."""
    bars = []
    for row in _rows(RESULTS / f"inference-{machine}.csv"):
        if row["dtype"] == "bfloat16" and row["impl"] in ("ember", "torch.compile"):
            workload = f"{MODEL_NAMES[row['model']]}\ninference, batch {row['batch']}"
            bars.append((workload, row["impl"], float(row["speedup"])))
    return bars


def training_bars(machine: str) -> list[tuple[str, str, float]]:
    """(workload, implementation, speedup over autocast bf16) for ember's bf16 training step."""
    bars = []
    for row in _rows(RESULTS / f"training-{machine}.csv"):
        if row["case"] == "ember bf16":
            shape = f"{row['batch']} x {row['seq']}" if row["seq"] else row["batch"]
            workload = f"{MODEL_NAMES[row['model']]}\ntraining, batch {shape}"
            bars.append((workload, "ember", float(row["speedup"])))
    return bars


def plot(bars: list[tuple[str, str, float]], machine: str, out: Path) -> None:
    workloads = list(dict.fromkeys(workload for workload, _, _ in bars))
    width = 0.8 / max(sum(w == workload for w, _, _ in bars) for workload in workloads)
    colors = {"ember": "#d9480f", "torch.compile": "#868e96"}
    fig, ax = plt.subplots(figsize=(9, 3.6), dpi=120)
    for j, workload in enumerate(workloads):
        present = [(impl, value) for w, impl, value in bars if w == workload]  # bars of a workload are centred
        for i, (impl, value) in enumerate(present):
            x = j + (i - (len(present) - 1) / 2) * width
            ax.bar(x, value, width, color=colors.get(impl, "#495057"), label=impl)
            ax.annotate(f"{value:.1f}x", (x, value), ha="center", va="bottom", fontsize=8)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(workloads)), workloads, fontsize=8)
    ax.set_ylabel("speedup over torch eager, bf16")
    ax.set_title(f"ember, bf16, measured on {machine} (benchmarks/results)", fontsize=9)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=8, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    # No software version in the metadata: the file changes only when the numbers do.
    fig.savefig(out, metadata={"Software": None})
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machine", default="intel-amx-16c-torch2", help="the results files' machine suffix")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs/_static/speedups.png")
    args = parser.parse_args()
    plot(inference_bars(args.machine) + training_bars(args.machine), args.machine, args.out)


if __name__ == "__main__":
    main()
