"""``ember.optimize`` of a model in train mode: split-BF16 master weights, the fused optimizer, channels-last
convolutions, ember's dropout and autocast (what each does: ember.optimize's docstring)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ember import optim as ember_optim
from ember._optimize.autocast_forward import (
    check_forward_replaceable,
    install_autocast_forward,
    install_float32_forward,
)
from ember._optimize.bf16_modules import layers_kept_float32, select_bf16_parameters, split_self_training_tables
from ember._optimize.channels_last import channels_last_by_default, convert_to_channels_last
from ember._optimize.dropout_modules import use_ember_dropout
from ember._optimize.fused_fast_paths import keep_off_fused_kernels, kept_off_note
from ember._optimize.fused_optimizer import check_convertible, fused_class_for, make_fused
from ember._optimize.report import OptimizeReport
from ember._optimize.vision_modules import use_ember_vision_ops
from ember.bf16.checkpoints import install_checkpoint_hooks
from ember.bf16.master_weights import split_parameter

LEVELS = ("O0", "O1")


@dataclass(frozen=True)
class TrainingFlags:
    """ember.optimize's training flags as the caller gave them (None: the level's default)."""

    split_master_weight_for_bf16: bool = True
    fuse_update_step: bool = True
    channels_last: bool | None = None
    replace_dropout: bool | None = None


def optimize_for_training(
    model: Any, bf16: bool, optimizer: Any, level: Any, inplace: bool, flags: TrainingFlags, report: bool
) -> Any:
    """The training half of ember.optimize: ``(model, optimizer)``, or the model alone without an optimizer."""
    _check_arguments(model, optimizer, level, bf16, flags)
    channels_last, replace_dropout = flags.channels_last, flags.replace_dropout
    for name, flag in (("channels_last", channels_last), ("replace_dropout", replace_dropout)):
        if flag is not None and not isinstance(flag, bool):
            raise TypeError(f"ember.optimize: {name} must be None, True or False, got {flag!r}")
    if channels_last is None:
        channels_last = bf16 and level == "O1" and channels_last_by_default()
    if replace_dropout is None:
        replace_dropout = bf16 and level == "O1"
    replacement = None
    if optimizer is not None and level == "O1" and flags.fuse_update_step:
        replacement = fused_class_for(optimizer)
        if replacement is not None:
            check_convertible(optimizer, replacement)

    log = OptimizeReport()
    selection = select_bf16_parameters(model) if bf16 and level == "O1" else None
    if inplace:
        new_bottoms: dict[torch.Tensor, torch.Tensor] = {}
        chosen = [p for _, p in selection.chosen] if selection else []
    else:
        model, optimizer, new_bottoms = _copy_with_split_weights(model, optimizer, selection)
        chosen = []
        log.actions.append(
            "copied the model"
            + (" and optimizer" if optimizer is not None else "")
            + (" (the weights to split were split straight from the originals)" if new_bottoms else "")
        )

    if replacement is not None:
        assert optimizer is not None
        log.actions.append(
            f"optimizer: torch.optim.{type(optimizer).__name__} -> ember.optim.{replacement.__name__} (fused step; "
            "param groups, state and hooks kept)"
        )
        make_fused(optimizer, replacement)
    bottoms = _split_master_weights(model, optimizer, selection, chosen, new_bottoms, log)
    _rewrite_modules(model, bf16, channels_last, replace_dropout, bottoms, optimizer, log)
    if report:
        print(log)
    return model if optimizer is None else (model, optimizer)


def _split_master_weights(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    selection: Any,
    chosen: Sequence[torch.Tensor],
    new_bottoms: dict[torch.Tensor, torch.Tensor],
    log: OptimizeReport,
) -> dict[torch.Tensor, torch.Tensor]:
    """Splits the selected parameters (those a copy did not split already), hooks the model's checkpoints to their
    bottom halves and keeps the layers torch cannot run in bf16 in fp32; returns the bottoms (the fused optimizer's
    dict, empty without one)."""
    # The bottom halves live in the fused optimizer; checkpoint hooks and layout changes share its dict.
    bottoms = optimizer._bottoms() if isinstance(optimizer, ember_optim.FusedOptimizer) else {}
    if selection is None:
        return bottoms
    assert isinstance(optimizer, ember_optim.FusedOptimizer)
    bottoms.update(new_bottoms)
    for p in chosen:
        split_parameter(p, bottoms)
    install_checkpoint_hooks(model, bottoms)
    log.converted = [(name, p.numel()) for name, p in selection.chosen]
    log.left = selection.left
    if tables := split_self_training_tables(model):
        log.actions.append(f"{tables} merged embedding bag module(s) that step themselves store their tables as "
                           "split-BF16")  # fmt: skip
    float32_layers = layers_kept_float32(model)
    for layer in float32_layers:
        install_float32_forward(layer)
    if float32_layers:
        log.actions.append(
            f"{len(float32_layers)} layer(s) that torch cannot run in bf16 here run in fp32 with autocast off"
        )
    return bottoms


def _rewrite_modules(
    model: nn.Module,
    bf16: bool,
    channels_last: bool,
    replace_dropout: bool,
    bottoms: dict[torch.Tensor, torch.Tensor],
    optimizer: torch.optim.Optimizer | None,
    log: OptimizeReport,
) -> None:
    """Channels-last convolutions, ember's dropout and vision modules, and the autocast forward."""
    optimizer_state = optimizer.state if optimizer is not None else {}
    if channels_last and (converted := convert_to_channels_last(model, bottoms, optimizer_state)):
        log.actions.append(f"{converted} convolution weight(s) made channels-last (oneDNN's fastest layout)")
    if replace_dropout:
        dropouts, attentions = use_ember_dropout(model)
        if dropouts:
            log.actions.append(f"{dropouts} nn.Dropout module(s) -> ember.nn.Dropout (parallel mask, none stored)")
        if attentions:
            log.actions.append(
                f"{attentions} nn.MultiheadAttention module(s) -> ember.nn.MultiheadAttention (attention dropout "
                "on ember's kernel)"
            )
    if swapped := use_ember_vision_ops(model):
        log.actions.append(f"{swapped} torchvision FrozenBatchNorm2d / RoIAlign module(s) -> ember.nn's")
    if bf16:
        install_autocast_forward(model, torch.bfloat16)
        log.actions.append("forward runs under torch.autocast('cpu', dtype=torch.bfloat16)")
        if note := kept_off_note(*keep_off_fused_kernels(model)):
            log.actions.append(note)


def _check_arguments(model: Any, optimizer: Any, level: Any, bf16: bool, flags: TrainingFlags) -> None:
    """Every refusal, before anything is changed or copied."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"ember.optimize: model must be a torch.nn.Module, got {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"ember.optimize: optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if level not in LEVELS:
        raise ValueError(f"ember.optimize: level must be one of {', '.join(LEVELS)}, got {level!r}")
    check_forward_replaceable(model)
    if not (bf16 and level == "O1"):
        return
    if not flags.split_master_weight_for_bf16:
        raise NotImplementedError(
            "ember.optimize: split_master_weight_for_bf16=False (an fp32 master copy beside bf16 weights) is not "
            "implemented; ember keeps bf16 master weights split, which gives the same results in less memory"
        )
    if optimizer is None:
        raise ValueError(
            "ember.optimize: bf16 training needs the optimizer (ember.optimize(model, optimizer=opt, "
            "dtype=torch.bfloat16)): it holds the bottom halves of the master weights"
        )
    if not flags.fuse_update_step:
        raise NotImplementedError(
            "ember.optimize: fuse_update_step=False with dtype=torch.bfloat16 is not implemented; split-BF16 "
            "master weights are updated by ember's fused step"
        )


def _copy_with_split_weights(
    model: nn.Module, optimizer: torch.optim.Optimizer | None, selection: Any
) -> tuple[nn.Module, torch.optim.Optimizer | None, dict[torch.Tensor, torch.Tensor]]:
    """Deep copies of model and optimizer in which every selected parameter is already split: its halves are made
    from the original directly and handed to deepcopy through the memo, so no fp32 copy of it ever exists."""
    memo: dict[int, Any] = {}
    bottoms: dict[torch.Tensor, torch.Tensor] = {}
    for _, p in selection.chosen if selection else []:
        # Shares the original's memory only until split_parameter gives it the top half; the original is untouched.
        split = nn.Parameter(p.detach(), requires_grad=p.requires_grad)
        split_parameter(split, bottoms)
        if p.grad is not None:
            split.grad = p.grad.to(torch.bfloat16)
        memo[id(p)] = split
    model = copy.deepcopy(model, memo)
    if optimizer is not None:
        optimizer = copy.deepcopy(optimizer, memo)
    return model, optimizer, bottoms
