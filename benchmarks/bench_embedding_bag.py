"""Merged embedding bags against a loop of nn.EmbeddingBag, at DLRM's shapes.

26 tables of dim 128 whose row counts step log-evenly from 10^3 to --max-rows (10^7 by default: Criteo's largest
tables; the total is about 3.3x the largest table), a batch of 2048 bags per table, and --pooling indices per bag
drawn uniformly. float32 weights. Each case cycles through enough such batches that one round of them gathers twice
the last-level cache: one batch looked up again and again would sit in the Xeon's 300 MiB L3 (at 1 and 10 indices
a bag), which no training run sees.

- forward: ``[t(i, o) for t in tables]`` against ``MergedEmbeddingBag(indices, offsets)``, and against the same
  with ``out=`` the same 26 outputs every call (a serving loop that keeps its output buffers);
- training step: forward, backward and optimizer step. torch: tables with ``sparse=True`` and torch.optim.SGD /
  Adagrad over their sparse gradients (the fastest stock path; dense gradients of 10^7-row tables would be worse).
  ember: MergedEmbeddingBagWithSGD / WithAdagrad, whose backward applies the step. "backward + update" is the
  training step's median less the forward's, for each.

GB/s counts the rows a forward gathers (batch x pooling x tables x 128 x 4 bytes); the ceiling beside it is the
in-place a += b stream, measured in the same run. Random gathers of 512-byte rows cannot reach a streaming
ceiling; the figure says how far off they are. At 1 index a bag the output is as large as what is gathered, so the
forward also runs beside a floor: as many rows read in order and copied into fresh outputs (26 x ``rows.clone()``),
which no lookup of random rows into fresh outputs can beat (it cycles through as many distinct runs).

    python benchmarks/bench_embedding_bag.py [--max-rows 10000000] [--pooling 1,10,100] [--optimizers sgd,adagrad]
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
from ember.nn import MergedEmbeddingBag, MergedEmbeddingBagWithAdagrad, MergedEmbeddingBagWithSGD

TABLES, DIM, BATCH = 26, 128, 2048


def table_rows(max_rows: int) -> list[int]:
    low = 1000
    return [round(low * (max_rows / low) ** (t / (TABLES - 1))) for t in range(TABLES)]


Batch = tuple[list[torch.Tensor], list[torch.Tensor]]


def make_batches(rows: list[int], pooling: int, gen: torch.Generator, max_count: int = 64) -> list[Batch]:
    """(indices, offsets) batches, as many as it takes to gather twice the last-level cache in one round through
    them (at least one, at most max_count)."""
    gathered = BATCH * pooling * len(rows) * DIM * 4
    count = min(max_count, max(1, math.ceil(2 * harness.last_level_cache_bytes() / gathered)))
    offsets = [torch.arange(0, BATCH * pooling, pooling) for _ in rows]
    return [([torch.randint(0, n, (BATCH * pooling,), generator=gen) for n in rows], offsets) for _ in range(count)]


def rotating(fn: Callable[..., Any], items: list[Any]) -> Callable[[], Any]:
    """A case that calls fn(*item) for the next item of `items` each time, round and round."""
    cycle = itertools.cycle(items)
    return lambda: fn(*next(cycle))


def copy_runs(weight: torch.Tensor, count: int) -> list[list[torch.Tensor]]:
    """The floor's reads: `count` sets of TABLES distinct runs of BATCH rows of `weight` (as many sets as it holds)."""
    count = max(1, min(count, weight.shape[0] // (TABLES * BATCH)))
    return [[weight[(k * TABLES + t) * BATCH : (k * TABLES + t + 1) * BATCH] for t in range(TABLES)]
            for k in range(count)]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-rows", type=int, default=10_000_000)
    parser.add_argument("--pooling", default="1,10,100")
    parser.add_argument("--optimizers", default="sgd,adagrad")
    parser.add_argument("--min-time", type=float, default=2.0)
    args = parser.parse_args()

    rows = table_rows(args.max_rows)
    bench = harness.Benchmark("embedding_bag", f"Merged embedding bags: {TABLES} tables x {DIM}, batch {BATCH}")
    bench.stream_ceiling()
    bench.note(f"Rows per table: {', '.join(f'{n:,}' for n in rows)} ({sum(rows) * DIM * 4 / 2**30:.1f} GiB float32).")
    gen = torch.Generator().manual_seed(0)
    tables = nn.ModuleList([nn.EmbeddingBag(n, DIM, mode="sum", sparse=True) for n in rows])
    with torch.no_grad():
        for t in tables:
            t.weight.uniform_(-0.05, 0.05, generator=gen)
    merged = MergedEmbeddingBag.from_embeddingbag_list(tables)  # shares the weights
    reused = [torch.empty(BATCH, DIM) for _ in rows]

    for pooling in (int(p) for p in args.pooling.split(",")):
        batches = make_batches(rows, pooling, gen)
        gathered = BATCH * pooling * TABLES * DIM * 4
        case = {"pooling": pooling}
        bench.note(f"{pooling} indices a bag: {len(batches)} batches in rotation.")
        contenders = {
            "torch loop": rotating(lambda i, o: [t(*io) for t, *io in zip(tables, i, o)], batches),
            "ember merged": rotating(merged, batches),
            # A serving loop's pattern: the same outputs every call (out=), no allocation and no fresh pages.
            "ember merged, out= reused": rotating(lambda i, o: merged(i, o, out=reused), batches),
        }
        if pooling == 1:
            # Distinct runs of BATCH rows in order, read from the largest table (no memory of its own: another
            # 54 MB held through the run changed how glibc's malloc served every contender's outputs).
            runs = copy_runs(tables[-1].weight, len(batches))
            contenders["floor: sequential copy"] = rotating(lambda *r: [x.clone() for x in r], runs)
        with torch.no_grad():
            forward = bench.interleaved(contenders, min_time=args.min_time)
        for impl, t in forward.items():
            bench.add(**case, pass_="forward", impl=impl, time=t, bytes=gathered, baseline=forward["torch loop"])

        for name in args.optimizers.split(","):
            torch_cls, ember_cls, hyper = {
                "sgd": (torch.optim.SGD, MergedEmbeddingBagWithSGD, {"lr": 0.01}),
                "adagrad": (torch.optim.Adagrad, MergedEmbeddingBagWithAdagrad, {"lr": 0.01}),
            }[name]
            optimizer = torch_cls(tables.parameters(), **hyper)
            fused = ember_cls.from_embeddingbag_list(list(tables), **hyper)  # the same weights again
            grads = [torch.randn(BATCH, DIM, generator=gen) for _ in rows]

            def torch_step(i, o, optimizer=optimizer, grads=grads) -> None:
                optimizer.zero_grad(set_to_none=True)
                torch.autograd.backward([t(*io) for t, *io in zip(tables, i, o)], grads)
                optimizer.step()

            def ember_step(i, o, fused=fused, grads=grads) -> None:
                torch.autograd.backward(fused(i, o), grads)

            steps = bench.interleaved({"torch loop": rotating(torch_step, batches),
                                       "ember fused": rotating(ember_step, batches)},
                                      min_time=args.min_time)  # fmt: skip
            for impl, t in steps.items():
                bench.add(**case, pass_=f"training step ({name})", impl=impl, time=t, baseline=steps["torch loop"])
            derived = {impl: steps[impl].median - forward[fwd].median
                       for impl, fwd in (("torch loop", "torch loop"), ("ember fused", "ember merged"))}  # fmt: skip
            for impl, seconds in derived.items():
                bench.record({**case, "pass_": f"backward + update ({name}, derived)", "impl": impl,
                              "median_us": seconds * 1e6, "speedup": derived["torch loop"] / seconds})  # fmt: skip
            del optimizer, fused
        bench.write()
    bench.note(
        "forward and training-step rows are medians of interleaved rounds (harness.time_interleaved); the derived "
        "backward + update rows subtract the forward median from the step median, so their spread is the two's "
        "together. speedup is over the torch loop. GB/s: the rows a forward gathers. The floor (1 index a bag): "
        "as many rows read in order and copied into fresh outputs, a bound no lookup into fresh outputs reaches (the "
        "out= row writes into the same outputs every call)."
    )
    bench.write()


if __name__ == "__main__":
    main()
