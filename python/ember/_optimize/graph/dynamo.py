"""``torch.compile(model, backend="ember")``: graph mode's passes on the graphs dynamo hands over.

Registered under the name ``ember`` through the ``torch_dynamo_backends`` entry point (pyproject.toml), which torch
reads the first time a backend name is asked for: ``import ember`` is not needed, and importing ember registers
nothing.

The compute dtype follows autocast, as eager's does: a compiled model called under ``torch.autocast("cpu",
dtype=torch.bfloat16)`` gets layers computing in bf16 (under a float16 autocast, fp16 where the CPU has
AVX512-FP16), one called without it fp32 (dynamo guards on the autocast state, so each gets its own graph). The
graph is traced under the state it runs under: model code that asks whether autocast is on (nn.MultiheadAttention's
choice of its fused inference kernel, which autocast turns off in eager) then decides as it does in eager, which a
backend turning autocast on around a graph traced without it would not give.

In a graph that needs autograd (the model in train mode, or inputs or parameters requiring grad under grad mode)
the passes are not run: the graph runs as dynamo gave it, on torch's eager operations, and a warning says so once.
Graph mode is for inference; ``ember.optimize(model, optimizer=...)`` is ember's training path.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from ember import _C
from ember._optimize.graph.passes import run_passes
from ember._optimize.graph.refs import TensorOperands
from ember._optimize.inference.common import cpu_autocast_dtype

__all__ = ["ember_backend"]

_TRAINING_NOTE = (
    "ember: torch.compile(backend='ember') rewrites inference graphs only; this graph records autograd (parameters "
    "or inputs that require grad, outside torch.no_grad() or torch.inference_mode()), so it runs as torch's eager "
    "operations. For inference, call the compiled model under torch.no_grad(); for training, use "
    "ember.optimize(model, optimizer=optimizer)."
)
_warned_training = False


def ember_backend(
    gm: fx.GraphModule, example_inputs: list[Any], options: dict[str, Any] | None = None
) -> Callable[..., Any]:
    """The ``ember`` backend of torch.compile: returns the callable dynamo runs in the graph's place."""
    if options:
        raise ValueError(
            f"torch.compile(backend='ember') takes no options, got {', '.join(map(repr, options))}: for bf16, call "
            "the compiled model under torch.autocast('cpu', dtype=torch.bfloat16)"
        )
    compute = _compute_under_autocast()
    if _records_autograd(gm, example_inputs):
        global _warned_training
        if not _warned_training:
            _warned_training = True
            warnings.warn(_TRAINING_NOTE, UserWarning, stacklevel=2)
        return gm.forward
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    examples = {n.name: value for n, value in zip(placeholders, example_inputs) if isinstance(value, torch.Tensor)}
    operands = TensorOperands(gm, gm, examples)
    run_passes(gm, operands, compute, replay=False)  # (its graphs pass the layers' tensors in: nothing to replay)
    return gm.forward


def _compute_under_autocast() -> torch.dtype:
    """The layers' compute dtype for the CPU autocast dynamo is tracing under (the state the graph will run under):
    its dtype where ember's kernels run it (bf16; fp16 on CPUs with AVX512-FP16), else fp32, whose layers then leave
    each call to torch and its autocast."""
    dtype = cpu_autocast_dtype()
    if dtype == torch.bfloat16 or (dtype == torch.float16 and _C.Linear.supported("float16")):
        return dtype
    return torch.float32


def _records_autograd(gm: fx.GraphModule, example_inputs: list[Any]) -> bool:
    if not torch.is_grad_enabled():
        return False
    if any(isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs):
        return True
    return any(p.requires_grad for p in gm.parameters())
