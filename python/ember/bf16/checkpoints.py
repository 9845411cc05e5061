"""Plain checkpoints for split-BF16 models: ``state_dict()`` gives the exact fp32 weights under the original keys, and
``load_state_dict()`` takes them back (or any floating values) and re-splits them.

A split parameter is its bf16 top half; its int16 bottom half lives in the dict that the optimizer steps
(``ember.bf16.master_weights``), which these hooks share. Every module that owns a split parameter gets two hooks
(torch's ``_register_state_dict_hook`` and ``_register_load_state_dict_pre_hook``, in every torch from 1.13 on): the
first replaces the bf16 entry by the join of the halves, the second splits the incoming value, writes the bottom
half and hands torch the top half to copy. ``state_dict(keep_vars=True)`` hands out the live parameters, as torch
does; those are the bf16 top halves. The hooks are plain objects, so ``copy.deepcopy`` and ``torch.save`` of the
whole model take them (and the bottom halves) along.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ember._compat import register_load_state_dict_pre_hook, register_state_dict_hook
from ember.bf16 import conversion as bf16


class SplitWeightsHooks:
    """The state-dict hooks of one module's split-BF16 parameters (``bottoms``: parameter -> bottom half)."""

    def __init__(self, bottoms: dict[torch.Tensor, torch.Tensor]) -> None:
        self.bottoms = bottoms

    def save(self, module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
        for name, p in module._parameters.items():
            if p is None:
                continue
            bottom = self.bottoms.get(p)
            key = prefix + name
            value = state_dict.get(key)
            if bottom is None or value is None or value is p:  # not split, not saved, or keep_vars=True
                continue
            state_dict[key] = bf16.join(p.detach(), bottom)

    def load(
        self,
        module: nn.Module,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: Any,
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        # torch's load_state_dict works on a shallow copy of the caller's dict, so replacing entries is local.
        for name, p in module._parameters.items():
            if p is None:
                continue
            bottom = self.bottoms.get(p)
            key = prefix + name
            value = state_dict.get(key)
            if bottom is None or not isinstance(value, torch.Tensor) or not value.is_floating_point():
                continue
            if value.shape != p.shape:
                continue  # torch reports the mismatch, naming the key
            top, low = bf16.split(value.detach().to(device="cpu", dtype=torch.float32))
            with torch.no_grad():
                bottom.copy_(low)
            state_dict[key] = top


def install_checkpoint_hooks(model: nn.Module, bottoms: dict[torch.Tensor, torch.Tensor]) -> int:
    """Hooks every module of ``model`` that owns a parameter in ``bottoms`` (once: a module hooked by an earlier
    ``ember.optimize`` keeps its hooks, pointed at ``bottoms``). Returns the number of modules newly hooked."""
    hooked = 0
    for module in model.modules():
        if not any(p is not None and p in bottoms for p in module._parameters.values()):
            continue
        existing = module.__dict__.get("_ember_checkpoint_hooks")
        if existing is not None:
            existing.bottoms = bottoms
            continue
        hooks = SplitWeightsHooks(bottoms)
        register_state_dict_hook(module, hooks.save)
        register_load_state_dict_pre_hook(module, hooks.load)
        module.__dict__["_ember_checkpoint_hooks"] = hooks
        hooked += 1
    return hooked
