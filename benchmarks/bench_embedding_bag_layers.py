"""Where the merged lookup's forward spends its time at 1 index a bag, layer by layer, beside a copy floor.

The DLRM shapes of bench_embedding_bag.py (26 tables of dim 128, 10^3 to --max-rows rows, batch 2048, one index a
bag), timed interleaved:

- ``torch loop``: ``[t(i, o) for t in tables]``;
- ``module``: ``MergedEmbeddingBag(indices, offsets)``, what a model calls (timed under ``torch.no_grad()``, so it
  normalizes its arguments and calls the kernel function directly: ``ember._library.dispatcher_needed``);
- ``operator``: ``torch.ops.ember.merged_embedding_bag`` on already-normalized lists (the module's argument checks
  and normalization left out);
- ``binding``: the operator's kernel function without the dispatcher: DLPack capsules, 26 fresh outputs and the
  ``ember._C`` call (``... preallocated outputs``: the same into outputs made once);
- ``floor: sequential copy``: as many rows read in order and cloned into fresh outputs, which no lookup of random
  rows into fresh outputs can beat.

The differences name what each layer costs; the binding against the floor says how much is left to the kernel.
Every case cycles through the batches (and the floor through the runs) of bench_embedding_bag.make_batches, so
the rows come from memory, not from a last-level cache that holds one batch's.

    python benchmarks/bench_embedding_bag_layers.py [--max-rows 10000000]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
from bench_embedding_bag import BATCH, DIM, TABLES, copy_runs, make_batches, rotating, table_rows
from ember import _C
from ember._tensor import dlpack, sync_threads
from ember.nn import MergedEmbeddingBag, embedding_bag_args, embedding_bag_ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-rows", type=int, default=10_000_000)
    parser.add_argument("--min-time", type=float, default=4.0)
    args = parser.parse_args()

    rows = table_rows(args.max_rows)
    bench = harness.Benchmark("embedding_bag_layers", f"Merged lookup forward by layer: {TABLES} x {DIM}, batch "
                              f"{BATCH}, 1 index a bag")  # fmt: skip
    bench.note(f"Rows per table: {rows[0]:,} to {rows[-1]:,}, log-even ({sum(rows) * DIM * 4 / 2**30:.1f} GiB).")
    gen = torch.Generator().manual_seed(0)
    tables = nn.ModuleList([nn.EmbeddingBag(n, DIM, mode="sum") for n in rows])
    with torch.no_grad():
        for t in tables:
            t.weight.uniform_(-0.05, 0.05, generator=gen)
    merged = MergedEmbeddingBag.from_embeddingbag_list(tables)
    batches = make_batches(rows, 1, gen)
    bench.note(f"{len(batches)} batches in rotation.")
    weights = [t.weight for t in merged]
    normalized = [embedding_bag_args.normalize_call(weights, i, o, None, None, False) for i, o in batches]
    made_once = [w.new_empty(BATCH, DIM) for w in weights]
    runs = copy_runs(tables[-1].weight, len(batches))

    def into_made_once(flat, starts, psw) -> None:
        """The operator's kernel function (embedding_bag_ops._forward_kernel) less its allocations."""
        idx, off, per_sample = embedding_bag_ops.kernel_inputs(weights, flat, starts, psw)
        sync_threads()
        _C.merged_embedding_bag_forward([dlpack(w) for w in weights], idx, off, per_sample,
                                        [dlpack(o) for o in made_once], mode="sum",
                                        include_last_offset=False)  # fmt: skip

    cases = {
        "torch loop": rotating(lambda i, o: [t(*io) for t, *io in zip(tables, i, o)], batches),
        "module": rotating(merged, batches),
        "operator": rotating(
            lambda *n: torch.ops.ember.merged_embedding_bag(weights, *n, "sum", False, False), normalized
        ),
        "binding": rotating(lambda *n: embedding_bag_ops._forward_kernel(weights, *n, "sum", False, False), normalized),
        "binding, preallocated outputs": rotating(into_made_once, normalized),
        "floor: sequential copy": rotating(lambda *r: [x.clone() for x in r], runs),
    }
    with torch.no_grad():
        timings = bench.interleaved(cases, min_time=args.min_time)
    for impl, t in timings.items():
        bench.add(impl=impl, time=t, bytes=BATCH * TABLES * DIM * 4, baseline=timings["torch loop"])
    bench.note(
        "Medians of interleaved rounds (harness.time_interleaved); speedup is over the torch loop; GB/s counts the "
        "rows gathered (or copied, for the floor)."
    )
    bench.write()


if __name__ == "__main__":
    main()
