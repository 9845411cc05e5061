"""``torch.jit.script`` of an ember-optimized model: TorchScript compiles the class's own forward of a twin.

ember's installed forwards (``module.forward``, an object on the instance) call ember._C, which TorchScript cannot
compile: scripting the model failed with "'SequentialForward' object has no attribute '__globals__'". TorchScript
asks each module for ``__prepare_scriptable__()`` before compiling it; every module of an optimized model answers
with a twin of its subtree that shares its parameters and buffers and has no installed forwards, so the scripted
module computes what the original classes compute (the same results, at torch's speed), and the optimized model
itself is left as it was.
"""

from __future__ import annotations

import copy
import itertools
import warnings
from typing import Any

from torch import nn

_INSTALLED = ("forward", "__prepare_scriptable__")
_DROP = object()  # what the twin's copy of an installed forward becomes, then removed
_NOTE = (
    "ember: torch.jit.script of an ember-optimized model compiles the modules' own forwards (ember's layers are not "
    "TorchScript): the scripted module computes the same results at torch's speed. For ember's speed, run the "
    "optimized module itself, or torch.compile it."
)
_warned = False


class ScriptableTwin:
    """A module's ``__prepare_scriptable__`` (an object, so the model still pickles and deep-copies)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __call__(self) -> nn.Module:
        global _warned
        if not _warned:
            _warned = True
            warnings.warn(_NOTE, UserWarning, stacklevel=3)
        return scriptable_twin(self.module)

    def __repr__(self) -> str:
        return f"ScriptableTwin({type(self.module).__name__})"


def scriptable_twin(module: nn.Module) -> nn.Module:
    """A copy of ``module``'s tree over the same parameter and buffer tensors, without ember's installed forwards."""
    memo: dict[int, Any] = {}
    for m in module.modules():
        for name in _INSTALLED:
            if name in m.__dict__:
                memo[id(m.__dict__[name])] = _DROP
        for t in itertools.chain(m._parameters.values(), m._buffers.values()):
            if t is not None:
                memo[id(t)] = t
    twin = copy.deepcopy(module, memo)
    for m in twin.modules():
        for name in _INSTALLED:
            if m.__dict__.get(name) is _DROP:
                del m.__dict__[name]
    return twin


def make_scriptable(model: nn.Module) -> None:
    """Gives every module of ``model`` the ``__prepare_scriptable__`` above, when any of them has an installed
    forward (so a submodule scripted on its own is served too)."""
    modules = list(model.modules())
    if not any("forward" in m.__dict__ for m in modules):
        return
    for m in modules:
        m.__dict__["__prepare_scriptable__"] = ScriptableTwin(m)
