"""The arithmetic one forward of each model of bench_models.py does, counted by torch's FLOP counter
(``torch.utils.flop_counter``: matrix products, convolutions, attention, its CPU operator given torch's formula) at
the batch sizes given.

Divided by the GEMM ceiling a bench_models.py run measured (torch.mm, n = 2048), a count is the least time a forward
could take on that machine if all of it ran at that rate, and the model's eager time over it the largest speedup over
eager that ceiling allows (models_goals.py reports both beside the goals). A count depends on neither the machine
nor the dtype; elementwise operations, norms and softmaxes are not counted (they would only lower the bound).

    python benchmarks/model_flops.py [--models all|resnet50,bert,...] [--batches 1,16]

Writes results/model-flops.csv (model, batch, gflop, torch).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import ALL, build, call

OUT = Path(__file__).resolve().parent / "results" / "model-flops.csv"


def count(name: str, batch: int) -> float:
    """GFLOP of one forward of ``name`` at ``batch`` (fp32, eval mode, no autograd)."""
    from torch.utils import flop_counter

    # torch's counter knows the attention operators of its GPU kernels; the CPU one gets the same formula (the two
    # products, a causal attention counted whole, as torch counts it)
    cpu_attention = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    mapping = {cpu_attention: _attention_flops} if cpu_attention is not None else {}
    model, inputs = build(name)
    kwargs = inputs(batch)
    with torch.no_grad(), flop_counter.FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        call(model, kwargs)
    return counter.get_total_flops() / 1e9


def _attention_flops(q: torch.Size, k: torch.Size, v: torch.Size, *args: object, **kwargs: object) -> int:
    from torch.utils import flop_counter

    return int(flop_counter.sdpa_flop_count(q, k, v))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="all")
    parser.add_argument("--batches", default="1,16")
    args = parser.parse_args()
    names = list(ALL) if args.models == "all" else args.models.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    rows = {}
    if OUT.exists():  # (a run of some models keeps the others' counts)
        with OUT.open(newline="") as f:
            rows = {(r["model"], r["batch"]): r for r in csv.DictReader(f)}
    version = torch.__version__.split("+")[0]
    for name in names:
        for batch in batches:
            gflop = count(name, batch)
            rows[(name, str(batch))] = {"model": name, "batch": str(batch), "gflop": f"{gflop:.2f}", "torch": version}
            print(f"{name} batch {batch}: {gflop:.2f} GFLOP", flush=True)
    with OUT.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["model", "batch", "gflop", "torch"])
        writer.writeheader()
        writer.writerows(sorted(rows.values(), key=lambda r: (ALL.index(r["model"]), int(r["batch"]))))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
