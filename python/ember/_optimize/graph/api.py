"""Graph mode of ``ember.optimize`` for inference: capture the forward (ember._graph.capture), run the passes
(:mod:`~ember._optimize.graph.passes`, which lists them in order), and install the rewritten graph as the model's
forward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx, nn

from ember._graph.capture import EXPORT, Capture, capture, split_sample_input
from ember._optimize.graph.forward import GraphForward
from ember._optimize.graph.passes import run_passes
from ember._optimize.graph.refs import TensorOperands
from ember._optimize.graph.submodules import capture_submodules
from ember._optimize.report import OptimizeReport


def capture_graph(model: nn.Module, sample_input: Any, compute: torch.dtype, log: OptimizeReport) -> Capture:
    """The model's forward as a graph (before any of ember's forwards is installed: capture must see torch's),
    checked under the autocast a bf16 model's forward runs under."""
    captured = capture(model, sample_input, compute if compute != torch.float32 else None)
    log.actions.append(captured.describe())
    return captured


def capture_parts(
    model: nn.Module, sample_input: Any, compute: torch.dtype, log: OptimizeReport
) -> list[tuple[str, nn.Module, Capture, Any]]:
    """Where the whole forward was not captured: the submodules that capture on their own
    (:mod:`~ember._optimize.graph.submodules`), each with its recorded input; the report gets one line per
    submodule tried."""
    tried, stopped = capture_submodules(model, sample_input, compute if compute != torch.float32 else None)
    for name, _, captured, _ in tried:
        log.actions.append(f"{name}: {captured.describe()}")
    if stopped:
        log.actions.append("capturing submodules stopped at its time budget: the rest run the module rewrite")
    elif not tried:
        log.actions.append("no submodule to capture on its own (each is a single layer or holds no parameters)")
    return [part for part in tried if part[2].graph is not None]


def install_graph(
    model: nn.Module,
    captured: Capture,
    compute: torch.dtype,
    sample_input: Any,
    log: OptimizeReport,
    name: str = "",
) -> GraphForward | None:
    """Runs the passes on the captured graph and installs it as ``model.forward``; None when nothing was captured,
    or when the rewritten graph fails on ``sample_input`` (the report says why). ``name``: the submodule's, for the
    report (the whole model when empty)."""
    gm = captured.graph
    if gm is None:
        return None
    where = f"{name}: " if name else ""
    called = _called_modules(gm)
    counts = run_passes(gm, TensorOperands(model, gm), compute)
    if sample_input is not None and (failure := _fails_on(gm, sample_input, compute)) is not None:
        log.actions.append(f"{where}graph mode not used: the rewritten graph failed on sample_input ({failure})")
        return None
    fused_away = [m for n, m in called.items() if n not in _called_modules(gm)]
    form = None
    if captured.path == EXPORT and sample_input is not None:
        args, kwargs = split_sample_input(sample_input)
        form = (len(args), frozenset(kwargs))
    forward = GraphForward(model, gm, captured.path, fused_away, model.__dict__.get("forward"), form)
    model.__dict__["forward"] = forward
    log.actions.append(f"{where}graph mode: {counts.describe()}")
    return forward


def _fails_on(gm: fx.GraphModule, sample_input: Any, compute: torch.dtype) -> str | None:
    """Why the rewritten graph cannot run ``sample_input`` (as the model's forward will run it), or None. The
    capture's check proved the graph before the passes; this one guards what the passes made of it, and builds the
    kernels for the sample's sizes on the way."""
    args, kwargs = split_sample_input(sample_input)
    low = compute != torch.float32
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=compute if low else torch.bfloat16, enabled=low):
            gm(*args, **kwargs)
    except Exception as error:  # any failure means the graph is not the model's forward
        lines = str(error).strip().splitlines()
        return f"{type(error).__name__}: {lines[0] if lines else ''}"
    return None


def _called_modules(gm: fx.GraphModule) -> dict[str, nn.Module]:
    return {str(n.target): gm.get_submodule(str(n.target)) for n in gm.graph.nodes if n.op == "call_module"}
