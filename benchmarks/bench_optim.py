"""Optimizer steps: ember.optim beside torch.optim's for-loop, foreach and fused implementations.

Parameter sets shaped like ResNet-50 (161 tensors, 25.6M parameters), BERT-base (199 tensors, 110M) and a few
large tensors (1M, 10M, 100M parameters). For each, the cases and the memory ceiling (in-place a += b) are timed
round-robin (harness.time_interleaved), so each step is compared with the bandwidth of the same moments.

ember runs with each parameter storage: fp32; bf16 parameters and gradients with fp32 state; split-BF16 (bf16 top
half + int16 bottom half, bf16 gradients, fp32 state). torch.optim runs on fp32 parameters: its way to keep
fp32-exact weights (for bf16 parameters it would keep bf16 state). Effective GB/s counts the bytes a step must
move per parameter: Adam reads p, g, m, v and writes p, m, v (fp32 28 B, bf16 22 B, split-BF16 26 B); SGD with
momentum reads p, g, b and writes p, b (fp32 20 B, bf16 14 B, split-BF16 18 B); Lamb reads and writes what Adam
does (28/22/26 B), the floor for any Lamb. torch has no Lamb: its peer is the same formula in torch ops, tensor by
tensor (``TorchLamb`` below), what a user without a fused Lamb runs.

Lamb needs both norms of a tensor before it can update it, so it passes over each tensor twice. ember runs both
passes over runs of tensors that fit in half the last-level cache: the first keeps each element's direction u,
the second reads p and u from the cache and writes p (12/8/12 B a parameter through the cache, beside the 28/22/26
B through memory). A tensor too large for a run (BERT-base's word embeddings on every machine measured) is read
twice from memory (40/34/42 B). Lamb's rows therefore carry a second ceiling, `pct_of_two_pass`: the time those
bytes take at the memory ceiling and at the cache ceiling (in-place a += b over one run's p and u, warm, timed
round-robin with the same cases) one after the other, against the row's time. One after the other because on the
Xeon measured a second pass run beside the next run's first (one parallel region) was no faster: the cache's
bandwidth does not add to memory's there (benchmarks/results/optim-goals.md).

    python benchmarks/bench_optim.py [--sets resnet50 bert-base 1M 10M 100M] [--optimizers adam sgd lamb]
                                     [--storages fp32 bf16 split-bf16]
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ember
import harness


def resnet50_shapes() -> list[tuple[int, ...]]:
    """The 161 parameter shapes of torchvision's ResNet-50 (53 convolutions, 53 batch norms, the classifier)."""
    shapes: list[tuple[int, ...]] = [(64, 3, 7, 7), (64,), (64,)]
    in_channels = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for block in range(blocks):
            out_channels = width * 4
            shapes += [(width, in_channels, 1, 1), (width,), (width,)]
            shapes += [(width, width, 3, 3), (width,), (width,)]
            shapes += [(out_channels, width, 1, 1), (out_channels,), (out_channels,)]
            if block == 0:
                shapes += [(out_channels, in_channels, 1, 1), (out_channels,), (out_channels,)]
            in_channels = out_channels
    return [*shapes, (1000, 2048), (1000,)]


def bert_base_shapes() -> list[tuple[int, ...]]:
    """The 199 parameter shapes of BERT-base (embeddings, 12 encoder layers, pooler)."""
    h, ffn = 768, 3072
    shapes: list[tuple[int, ...]] = [(30522, h), (512, h), (2, h), (h,), (h,)]
    for _ in range(12):
        shapes += [(h, h), (h,)] * 4 + [(h,), (h,), (ffn, h), (ffn,), (h, ffn), (h,), (h,), (h,)]
    return [*shapes, (h, h), (h,)]


SETS = {
    "resnet50": resnet50_shapes,
    "bert-base": bert_base_shapes,
    "1M": lambda: [(2**20,)],
    "10M": lambda: [(2_500_000,)] * 4,
    "100M": lambda: [(25_000_000,)] * 4,
}
# Bytes moved per parameter, by optimizer and parameter storage.
BYTES = {
    "adam": {"fp32": 28, "bf16": 22, "split-bf16": 26},
    "sgd": {"fp32": 20, "bf16": 14, "split-bf16": 18},
    "lamb": {"fp32": 28, "bf16": 22, "split-bf16": 26},  # the second pass reads the cache (module docstring)
}
STORAGES = ["fp32", "bf16", "split-bf16"]
# What a Lamb step moves per parameter, by parameter storage (csrc/optim/lamb.cpp): through memory over a tensor
# that fits a cache run, through the cache in that run's second pass (p and the kept direction read, p written), and
# through memory over a tensor too large for a run (its second pass reads p, m and v again and writes p).
LAMB_KEPT_MEMORY = BYTES["lamb"]
LAMB_KEPT_CACHE = {"fp32": 12, "bf16": 8, "split-bf16": 12}
LAMB_TWICE_MEMORY = {"fp32": 40, "bf16": 34, "split-bf16": 42}
LAMB_RUN_BYTES_PER_ELEMENT = 20  # what a run holds per element (p, g, m, v, u): lamb.cpp's kLambBytesPerElement


def last_level_cache_mib() -> float:
    return harness.last_level_cache_bytes() / 2**20


def lamb_run_budget() -> int:
    """The bytes one of Lamb's cache runs may hold (lamb.cpp: half the last-level cache)."""
    return harness.last_level_cache_bytes() // 2


def lamb_kept_and_twice(set_name: str) -> tuple[int, int]:
    """The parameters of ``set_name`` whose tensors fit a cache run, and those of the tensors that do not."""
    numels = [functools.reduce(lambda a, b: a * b, shape, 1) for shape in SETS[set_name]()]
    kept = sum(n for n in numels if n * LAMB_RUN_BYTES_PER_ELEMENT <= lamb_run_budget())
    return kept, sum(numels) - kept


def lamb_two_pass_seconds(set_name: str, storage: str, memory_gbs: float, cache_gbs: float) -> float:
    """The least time a two-pass Lamb step over ``set_name`` takes: its memory bytes at the memory ceiling, then its
    second passes' cache bytes at the cache ceiling."""
    kept, twice = lamb_kept_and_twice(set_name)
    memory = kept * LAMB_KEPT_MEMORY[storage] + twice * LAMB_TWICE_MEMORY[storage]
    return memory / (memory_gbs * 1e9) + kept * LAMB_KEPT_CACHE[storage] / (cache_gbs * 1e9)


class TorchLamb(torch.optim.Optimizer):
    """ember.optim.Lamb's formula (bias-corrected Adam direction plus weight decay, scaled per tensor by
    ||p|| / ||u||) in torch ops, one tensor at a time."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                state["step"] += 1
                m, v, g, t = state["exp_avg"], state["exp_avg_sq"], p.grad, state["step"]
                m.lerp_(g, 1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                u = (m / (1 - beta1**t)).div_((v / (1 - beta2**t)).sqrt_().add_(group["eps"]))
                u.add_(p, alpha=group["weight_decay"])
                p_norm, u_norm = float(p.norm()), float(u.norm())
                trust = p_norm / u_norm if p_norm > 0 and u_norm > 0 else 1.0
                p.add_(u, alpha=-group["lr"] * trust)


def make_optimizer(kind: str, impl: str, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    if kind == "lamb":
        if impl == "ember":
            return ember.optim.Lamb(params, lr=1e-3, weight_decay=0.01)
        return TorchLamb(params, lr=1e-3)
    if kind == "adam":
        if impl == "ember":
            return ember.optim.Adam(params, lr=1e-3)
        return torch.optim.Adam(params, lr=1e-3, **{"for-loop": {"foreach": False}, "foreach": {"foreach": True},
                                                   "fused": {"fused": True}}[impl])  # fmt: skip
    if impl == "ember":
        return ember.optim.SGD(params, lr=1e-3, momentum=0.9)
    return torch.optim.SGD(params, lr=1e-3, momentum=0.9, **{"for-loop": {"foreach": False},
                           "foreach": {"foreach": True}, "fused": {"fused": True}}[impl])  # fmt: skip


def make_case(kind: str, impl: str, storage: str, shapes, gen: torch.Generator):
    """The step function of one case, on freshly made parameters and gradients of the given storage."""
    params = [torch.randn(s, generator=gen).requires_grad_() for s in shapes]
    grad_dtype = torch.float32 if storage == "fp32" else torch.bfloat16
    if storage == "bf16":
        params = [p.detach().to(torch.bfloat16).requires_grad_() for p in params]
    optimizer = make_optimizer(kind, impl, params)
    if storage == "split-bf16":
        optimizer.split_master_weights()
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen).to(grad_dtype)
    return optimizer.step


@functools.cache
def torch_has_cpu_fused(kind: str) -> bool:
    """Whether the running torch has a CPU fused kernel for ``kind`` (asked once: a tiny step)."""
    try:
        p = torch.zeros(4, requires_grad=True)
        p.grad = torch.zeros(4)
        make_optimizer(kind, "fused", [p]).step()
        return True
    except (RuntimeError, TypeError, ValueError):
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS))
    parser.add_argument("--optimizers", nargs="+", default=list(BYTES), choices=list(BYTES))
    parser.add_argument("--storages", nargs="+", default=STORAGES, choices=STORAGES, help="of ember's parameters")
    parser.add_argument("--min-time", type=float, default=4.0, help="seconds of timing per parameter set")
    args = parser.parse_args()

    bench = harness.Benchmark("optim", "Optimizer step: ember.optim vs torch.optim, against the memory ceiling")
    stream_fn, stream_bytes = harness.stream_kernel()
    # One run's p and u: what a Lamb second pass reads from the cache.
    cache_fn, cache_bytes = harness.cache_kernel(lamb_run_budget() // LAMB_RUN_BYTES_PER_ELEMENT)
    cache_gbs_seen: list[float] = []
    gen = torch.Generator().manual_seed(0)
    for kind in args.optimizers:
        torch_impls = ["for-loop"] if kind == "lamb" else ["for-loop", "foreach"]
        impls = torch_impls + (["fused"] if kind != "lamb" and torch_has_cpu_fused(kind) else []) + ["ember"]
        for set_name in args.sets:
            shapes = SETS[set_name]()
            n = sum(torch.Size(s).numel() for s in shapes)
            # (impl, storage) -> step; torch's on fp32 parameters, ember's on each storage asked for.
            runs = [(impl, "fp32") for impl in impls if impl != "ember"] + [("ember", s) for s in args.storages]
            cases = {"ceiling": stream_fn}
            if kind == "lamb":
                cases["cache"] = cache_fn
            for impl, storage in runs:
                cases[f"{impl}/{storage}"] = make_case(kind, impl, storage, shapes, gen)
            rounds = 6 if n > 50_000_000 else 12
            timings = bench.interleaved(cases, rounds=rounds, min_time=args.min_time, warmup=1)
            ceiling = stream_bytes / timings.pop("ceiling").median / 1e9
            cache_gbs = cache_bytes / timings.pop("cache").median / 1e9 if kind == "lamb" else 0.0
            if cache_gbs:
                cache_gbs_seen.append(cache_gbs)
            baseline = timings["for-loop/fp32"]
            for impl, storage in runs:
                time = timings[f"{impl}/{storage}"]
                after = {}
                if cache_gbs:
                    two_pass = lamb_two_pass_seconds(set_name, storage, ceiling, cache_gbs)
                    after["pct_of_two_pass"] = 100 * two_pass / time.median
                bench.add(
                    optimizer=kind, params=set_name, tensors=len(shapes), numel=n, impl=impl, storage=storage,
                    time=time, bytes=BYTES[kind][storage] * n, baseline=baseline, ceiling_gbs=ceiling, after=after,
                )  # fmt: skip
            del cases
    if cache_gbs_seen:
        bench.ceilings[
            f"cache (in-place a += b over 2 x {lamb_run_budget() // LAMB_RUN_BYTES_PER_ELEMENT} elements, warm)"
        ] = f"{min(cache_gbs_seen):.0f}-{max(cache_gbs_seen):.0f} GB/s over the Lamb sets"
    bench.note(
        "GB/s counts the bytes a step must move per parameter (Adam and Lamb 28/22/26 B, SGD with momentum "
        "20/14/18 B, for fp32/bf16/split-BF16 parameters; state is fp32 in every case). Lamb's 28/22/26 B are the "
        "floor for any Lamb; it passes over each tensor twice, the second time from the last-level cache where the "
        "tensor's p, g, m, v and kept direction fit in half of it "
        f"({last_level_cache_mib():.0f} MiB here; 12/8/12 B a parameter through the cache), from memory where not "
        "(40/34/42 B). `pct_of_two_pass` compares Lamb's rows with the time those bytes take at the same moments' "
        "memory and cache ceilings, one after the other (the module docstring says why). Lamb's "
        "torch row is the same formula in torch ops, tensor by tensor (torch has no Lamb). torch.optim runs on fp32 "
        "parameters. Each "
        "parameter set's cases and the memory ceiling (in-place a += b over 2 x 256 MB) were timed round-robin; "
        "`pct_of_ceiling` compares each with the ceiling of the same moments. `speedup` is over torch's for-loop. "
        "torch's fused rows appear where the running torch has a CPU fused kernel (torch >= 2.4). The issue's goals "
        "are weighed against these numbers in optim-goals.md."
    )
    bench.write()


if __name__ == "__main__":
    main()
