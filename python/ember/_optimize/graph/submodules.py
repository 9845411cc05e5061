"""Graph mode for the parts of a model whose whole forward cannot be captured: a forward with Python control flow
over tensor values (``if x.sum() > 0``), or any Hugging Face model on a torch without ``torch.export`` (1.13),
still calls submodules that capture on their own (an encoder's layers, a CNN's stages).

Where the whole forward fails, its submodules are tried from the top down, each on the inputs it received in one
run of ``sample_input`` (recorded by forward pre-hooks, so every capture is checked on real inputs, as the whole
model's is); a submodule that captures gets its own graph forward, and the search does not descend into it; one that
fails is searched in turn. Submodules that hold no parameters, and single layers (the module-level rewrite runs
those as well as a graph would), are not tried, and the search stops after 10 seconds of capturing. A submodule
called more than once is captured on its first call's inputs; its other calls run the same graph (sizes are
dynamic) or, for inputs it was not captured for, the module-level rewrite.

The report lists each submodule tried, the path that captured it or why none did.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from typing import Any

import torch
from torch import nn

from ember._graph.capture import Capture, capture, split_sample_input

# A forward's inputs as recorded: positional arguments, or (when it had keyword arguments) all of them by name.
Recorded = Any

_MAX_DEPTH = 4  # below the model: its children, their children, ...
# Seconds of capturing parts before the search stops (a torch.export attempt takes seconds on a large part): what is
# left untried runs the module rewrite, and ember.optimize stays within seconds.
_BUDGET_S = 10.0
_LEAVES = (nn.Linear, nn.modules.conv._ConvNd, nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.Embedding)


def capture_submodules(
    model: nn.Module, sample_input: Any, autocast: torch.dtype | None
) -> tuple[list[tuple[str, nn.Module, Capture, Recorded]], bool]:
    """``(name, module, capture, its recorded input)`` for every submodule tried, top-down (the caller installs the
    ones that captured), and whether the time budget stopped the search with submodules left to try."""
    recorded = _record_inputs(model, sample_input, autocast) if sample_input is not None else {}
    tried: list[tuple[str, nn.Module, Capture, Recorded]] = []
    frontier = [(name, child, 1) for name, child in model.named_children()]
    seen: set[int] = set()
    deadline = time.monotonic() + _BUDGET_S
    while frontier and time.monotonic() < deadline:
        name, module, depth = frontier.pop(0)
        if id(module) in seen or depth > _MAX_DEPTH or not _worth_trying(module):
            continue
        seen.add(id(module))
        if sample_input is not None and module not in recorded:
            continue  # not called in the sample's forward: nothing to check a capture on
        sample = recorded.get(module)
        captured = capture(module, sample, autocast)
        tried.append((name, module, captured, sample))
        if captured.graph is None:
            frontier += [(f"{name}.{n}", c, depth + 1) for n, c in module.named_children()]
    return tried, bool(frontier)


def _worth_trying(module: nn.Module) -> bool:
    """A module with parameters that is not a single layer."""
    return not isinstance(module, _LEAVES) and any(True for _ in module.parameters())


def _record_inputs(model: nn.Module, sample_input: Any, autocast: torch.dtype | None) -> dict[nn.Module, Recorded]:
    """Each submodule's inputs at its first call in one run of ``sample_input``."""
    recorded: dict[nn.Module, Recorded] = {}
    handles = []

    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> None:
        if module in recorded:
            return
        if not kwargs:
            recorded[module] = tuple(args)
            return
        with contextlib.suppress(TypeError, ValueError):  # (a forward inspect cannot read: left untried)
            named = _by_name(module, args, kwargs)
            if named is not None:
                recorded[module] = named

    takes_kwargs = "with_kwargs" in inspect.signature(nn.Module.register_forward_pre_hook).parameters  # torch >= 2.0
    for module in model.modules():
        if module is model:
            continue
        if takes_kwargs:
            handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
        else:
            handles.append(module.register_forward_pre_hook(hook))
    args, kwargs = split_sample_input(sample_input)
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            model(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return recorded


def _by_name(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """A call's positional and keyword arguments all by name, as capture takes a dict of keyword inputs (``**kwargs``
    spread into it); None when some went to ``*args``, which no name reaches."""
    signature = inspect.signature(module.forward)
    named: dict[str, Any] = {}
    for key, value in signature.bind(*args, **kwargs).arguments.items():
        kind = signature.parameters[key].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            if value:
                return None
        elif kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        else:
            named[key] = value
    return named
