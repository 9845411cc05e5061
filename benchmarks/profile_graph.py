"""Where a graph-mode forward's time goes, fused node by fused node: a diagnosis, not a benchmark (no ceiling, no
baseline; its numbers explain the ones bench_models.py reports).

For one model of bench_models.py's list (or any model through :func:`profile`), four views of the same forward:

- **hot**: each distinct fused call (node class and input shapes) timed in a loop over itself, its inputs as the
  forward recorded them, inside the graph's guard (fast calls on), beside torch's op on the same shapes where one
  is obvious (``torch.mm`` for a Linear, ``F.layer_norm`` for a norm);
- **in order**: every fused call replayed in the forward's order with its recorded inputs, each timed after the call
  before it (``first``: that call's data in the caches, but not this call's inputs, which were last written a whole
  replay earlier, where a forward's were just written: colder than the forward), after the call before it and its
  own floating-point inputs rewritten in place by torch (``fresh``: its inputs just written, as in a forward; the
  column to compare with the forward), and at once again (``again``: its own data in the caches);
- **replay**: the whole in-order replay, against the forward itself: equal, the interpreter between the nodes costs
  nothing; short of it, the difference is the graph's other nodes and the interpreter;
- **skeleton**: the forward with every fused node answering its recorded output at once: the graph's other nodes
  (views, embeddings, adds), the guard and the interpreter.

    python benchmarks/profile_graph.py bert [--batch 1] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ember
import harness
from ember._optimize.graph.fast_calls import checked
from ember._optimize.graph.forward import GraphForward
from ember._optimize.graph.replay import ReplaySegment
from ember._optimize.inference.common import cpu_autocast_dtype


@dataclass
class Call:
    """One fused node's call as the forward made it."""

    module: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def __call__(self) -> Any:
        return self.module(*self.args, **self.kwargs)

    def rewrite_inputs(self, model_tensors: set[int]) -> None:
        """Writes each floating-point tensor argument anew where it lies (``mul_(1)``, which keeps every value), so
        that the call finds its inputs just written, as the call before it leaves them in a forward; not the model's
        own tensors (``model_tensors``: their data pointers), whose version a write would bump."""
        for a in (*self.args, *self.kwargs.values()):
            if isinstance(a, torch.Tensor) and a.is_floating_point() and a.data_ptr() not in model_tensors:
                a.mul_(1)

    @property
    def kind(self) -> str:
        shapes = ", ".join(str(tuple(a.shape)) if isinstance(a, torch.Tensor) else type(a).__name__ for a in self.args)
        return f"{type(self.module).__name__} ({shapes})"


@dataclass
class Profile:
    """The four views, in microseconds."""

    forward_us: float
    replay_us: float
    skeleton_us: float
    calls: int
    hot: dict[str, tuple[int, float, str]] = field(default_factory=dict)  # kind -> (count, us a call, torch's op)
    # kind -> (count, first, fresh, again)
    in_order: dict[str, tuple[int, float, float, float]] = field(default_factory=dict)

    def report(self) -> str:
        lines = [f"forward {self.forward_us / 1e3:.2f} ms; {self.calls} fused calls"]
        lines.append("hot (each distinct call in a loop over itself):")
        for kind, (count, us, beside) in sorted(self.hot.items(), key=lambda kv: -kv[1][0] * kv[1][1]):
            lines.append(f"  {us:9.1f} us x{count:3d} = {us * count / 1e3:6.2f} ms  {kind}{beside}")
        hot_sum = sum(count * us for count, us, _ in self.hot.values())
        lines.append(f"  sum {hot_sum / 1e3:.2f} ms")
        lines.append(
            "in the forward's order (first: after the call before it, inputs cold; fresh: inputs just rewritten, as in"
            " a forward; again: at once after):"
        )
        for kind, (count, first, fresh, again) in sorted(self.in_order.items(), key=lambda kv: -kv[1][2]):
            lines.append(
                f"  {first / 1e3:6.2f} ms first, {fresh / 1e3:6.2f} ms fresh, {again / 1e3:6.2f} ms again, x{count:3d}"
                f"  {kind}"
            )
        sums = [sum(v[i] for v in self.in_order.values()) / 1e3 for i in (1, 2, 3)]
        lines.append(f"  sum {sums[0]:.2f} ms first, {sums[1]:.2f} ms fresh, {sums[2]:.2f} ms again")
        lines.append(f"replay of the fused calls in order {self.replay_us / 1e3:.2f} ms")
        lines.append(f"skeleton (fused nodes answering at once) {self.skeleton_us / 1e3:.2f} ms")
        return "\n".join(lines)


def median_us(fn: Callable[[], Any], samples: int) -> float:
    """harness.time_call's median, in microseconds, over at most ``samples`` samples (at least 5)."""
    return harness.time_call(fn, min_time=0.5, max_samples=samples).median * 1e6


def graph_of(optimized: nn.Module) -> GraphForward:
    forward = optimized.__dict__.get("forward")
    forward = getattr(forward, "inner", forward)
    if not isinstance(forward, GraphForward):
        raise ValueError(
            "the model has no graph-mode forward (ember.optimize(..., graph_mode=True) did not capture it)"
        )
    return forward


def _torch_beside(call: Call, samples: int) -> str:
    """torch's own op on the call's shapes, where one is obvious."""
    x = call.args[0] if call.args else None
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        return ""
    name = type(call.module).__name__
    if name == "FusedNorm":
        weight = torch.ones(x.shape[-1], dtype=x.dtype)
        us = median_us(lambda: F.layer_norm(x, (x.shape[-1],), weight, weight), samples)
        return f" | torch layer_norm {us:.1f} us"
    if "Linear" in name:
        out = call()
        outs = out if isinstance(out, (tuple, list)) else (out,)
        n = sum(o.shape[-1] for o in outs if isinstance(o, torch.Tensor))
        m, k = x.numel() // x.shape[-1], x.shape[-1]
        dtype = outs[0].dtype if outs and isinstance(outs[0], torch.Tensor) else x.dtype
        a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
        us = median_us(lambda: torch.mm(a, b), samples)
        return f" | torch.mm {us:.1f} us [{m}x{k}x{n}]"
    return ""


def profile(optimized: nn.Module, run: Callable[[], Any], samples: int = 30) -> Profile:
    """The four views of ``run()``, a call of ``optimized`` (a graph-mode model) on fixed inputs, under
    torch.inference_mode(); the replayed segments run their nodes one by one meanwhile, so that each is seen."""
    ReplaySegment.enabled = False
    try:
        return _profile(optimized, run, samples)
    finally:
        ReplaySegment.enabled = True


def _profile(optimized: nn.Module, run: Callable[[], Any], samples: int) -> Profile:
    graph = graph_of(optimized)
    fused = [m for _, m in graph.graph.named_children() if type(m).__name__.startswith("Fused")]
    order: list[Call] = []
    recorded: dict[nn.Module, Any] = {}
    autocast: list[torch.dtype | None] = []  # the autocast the forward runs its fused nodes under (bf16: on)

    def recording(module: nn.Module) -> Callable[..., Any]:
        def forward(*args: Any, **kwargs: Any) -> Any:
            if not autocast:
                autocast.append(cpu_autocast_dtype())
            order.append(Call(module, args, kwargs))
            out = type(module).forward(module, *args, **kwargs)
            recorded.setdefault(module, out)
            return out

        return forward

    with torch.inference_mode():
        run()
        _set_forwards(fused, recording)
        try:
            run()
        finally:
            _set_forwards(fused, None)
        forward_us = median_us(run, samples)
        counts = Counter(call.kind for call in order)
        distinct: dict[str, Call] = {}
        for call in order:
            distinct.setdefault(call.kind, call)
        result = Profile(forward_us, 0.0, 0.0, len(order))
        # Replayed under the forward's autocast: a node's plan (its result's dtype, its fast call) depends on it, and
        # outside it a node can leave the call to the graph's own operations, which then mix dtypes.
        dtype = autocast[0] if autocast else None
        under_autocast = torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None)
        with under_autocast, checked(graph.guard()):
            for kind, call in distinct.items():
                result.hot[kind] = (counts[kind], median_us(call, samples * 4), _torch_beside(call, samples * 4))
            first: dict[int, list[float]] = defaultdict(list)
            fresh: dict[int, list[float]] = defaultdict(list)
            model_tensors = {t.data_ptr() for t in (*optimized.parameters(), *optimized.buffers())}
            again: dict[int, list[float]] = defaultdict(list)
            for _ in range(max(samples // 2, 3)):
                for i, call in enumerate(order):
                    start = time.perf_counter()
                    call()
                    middle = time.perf_counter()
                    call()
                    first[i].append(middle - start)
                    again[i].append(time.perf_counter() - middle)
                for i, call in enumerate(order):
                    if i:
                        order[i - 1]()
                    call.rewrite_inputs(model_tensors)
                    start = time.perf_counter()
                    call()
                    fresh[i].append(time.perf_counter() - start)
            for i, call in enumerate(order):
                count, f, r, a = result.in_order.get(call.kind, (0, 0.0, 0.0, 0.0))
                result.in_order[call.kind] = (
                    count + 1,
                    f + statistics.median(first[i]) * 1e6,
                    r + statistics.median(fresh[i]) * 1e6,
                    a + statistics.median(again[i]) * 1e6,
                )

            def replay() -> None:
                for call in order:
                    call()

            result.replay_us = median_us(replay, samples)
        _set_forwards(fused, lambda module: (lambda *a, **k: recorded[module]) if module in recorded else None)
        try:
            result.skeleton_us = median_us(run, samples)
        finally:
            _set_forwards(fused, None)
    return result


def _set_forwards(modules: list[nn.Module], make: Callable[[nn.Module], Any] | None) -> None:
    """Gives each module the forward ``make(module)`` returns, in its instance dict (which nn.Module's call reads
    first), or its class's own again where ``make`` is None or returns None."""
    for module in modules:
        forward = None if make is None else make(module)
        if forward is None:
            module.__dict__.pop("forward", None)
        else:
            module.__dict__["forward"] = forward


def main() -> None:
    import bench_models

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a name from bench_models.py's list (resnet50, bert, llama, ...)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--samples", type=int, default=30)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    model, make = bench_models.build(args.model)
    inputs = make(args.batch)
    optimized = ember.optimize(model, dtype=dtype, graph_mode=True, sample_input=make(1))

    def run() -> Any:
        return optimized(**inputs) if isinstance(inputs, dict) else optimized(inputs)

    print(f"{args.model}, batch {args.batch}, {args.dtype}, {torch.get_num_threads()} threads")
    print(profile(optimized, run, args.samples).report())


if __name__ == "__main__":
    main()
