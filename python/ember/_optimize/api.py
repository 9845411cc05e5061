"""``ember.optimize``: one call that prepares a model (and its optimizer) for fast training on x86 CPUs."""

from __future__ import annotations

import copy
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
from ember._optimize.channels_last import convert_to_channels_last
from ember._optimize.dropout_modules import use_ember_dropout
from ember._optimize.fused_fast_paths import keep_off_fused_kernels, kept_off_note
from ember._optimize.fused_optimizer import check_convertible, fused_class_for, make_fused
from ember._optimize.inference.api import InferenceFlags, optimize_for_inference
from ember._optimize.report import OptimizeReport
from ember._optimize.vision_modules import use_ember_vision_ops
from ember.bf16.checkpoints import install_checkpoint_hooks
from ember.bf16.master_weights import split_parameter

_LEVELS = ("O0", "O1")


def optimize(
    model: nn.Module,
    dtype: torch.dtype | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    level: str = "O1",
    inplace: bool = False,
    *,
    split_master_weight_for_bf16: bool = True,
    fuse_update_step: bool = True,
    channels_last: bool | None = None,
    replace_dropout: bool | None = None,
    conv_bn_folding: bool | None = None,
    linear_bn_folding: bool | None = None,
    weights_prepack: bool | None = None,
    replace_dropout_with_identity: bool | None = None,
    sample_input: Any = None,
    report: bool = False,
) -> Any:
    """Prepares ``model`` for the CPU: for training (a model in train mode, with its optimizer) it returns
    ``(model, optimizer)``, or the model alone when no optimizer is given; for inference (a model in eval mode)
    it returns the rewritten model.

    **Inference** (``model.eval()``; see docs/decisions.md, "Inference"). At level ``"O1"``:

    - ``nn.Linear`` (and Hugging Face ``Conv1D``) layers run on oneDNN's matmul, primitives cached per input
      shape (``weights_prepack``). A weight already in the compute dtype is read where it is; a weight that must
      change to be used (fp32 weights of a bf16 computation, a folded BatchNorm) is computed once into the
      layout the primitive prefers.
    - Conv1d/2d/3d and ConvTranspose1d/2d/3d run on oneDNN convolutions with the weight reordered once; 2-D and
      3-D ones read and write channels-last activations (an input in torch's default layout is converted at the
      first convolution, and outputs stay channels-last, as in a torch model converted to channels-last).
    - In ``nn.Sequential`` (and subclasses keeping its forward, such as torchvision's Conv2dNormActivation), a
      Linear or convolution and the BatchNorm after it (``linear_bn_folding``, ``conv_bn_folding``), activations
      (ReLU, GELU, SiLU, Sigmoid, Tanh, Hardswish, Hardsigmoid, ReLU6) and eval-mode dropouts after it run as one
      call: the BatchNorm folded into the weights, the activations as post-ops.
    - Known containers get the same fusion, residual adds included: torchvision's ResNet, BasicBlock, Bottleneck
      and SqueezeExcitation; Hugging Face's BERT/RoBERTa intermediate (Linear + GELU) and output (Linear +
      residual add) blocks, ViT MLP (Linear + GELU), and ResNet convolution layers, shortcuts and residual layers
      (conv + BN + ReLU, the last with the shortcut's add).
    - Dropout modules return their input at once in eval mode (``replace_dropout_with_identity``).
    - ``dtype=torch.bfloat16``: the kernels compute in bf16 (from a bf16 copy of fp32 weights), the forward runs
      under ``torch.autocast("cpu", dtype=torch.bfloat16)`` (fp32 inputs work as they are, and so does an enclosing
      autocast block); ``dtype=None`` or ``torch.float32`` computes in fp32.

    Memory: nothing is copied that can be used as it is. The returned model shares its parameters' memory with the
    original (``inplace=False`` copies the module tree and buffers only), Linear weights in the compute dtype run
    in place, and the copies ember does make are caches in the compute dtype: bf16 copies of fp32 weights (half
    their size), and the blocked weights of convolutions (oneDNN has no fast convolution on torch's weight layout)
    and of layers with a BatchNorm folded in (new numbers), made at their first call. ``weights_prepack=True``
    (given explicitly) trades memory for speed: every Linear weight gets a packed copy too, which runs fp32
    Linears 1.2-2.9x torch from a few rows where reading the weight in place runs 0.9-2.2x (BERT-base fp32
    end to end at batch 1: 1.07-1.17x packed, 0.92-0.97x in place on the Xeon).

    Parameters, buffers, ``state_dict()`` keys, shapes and dtypes, module classes and the module tree stay those
    of the original: the prepacked weights are a cache, rebuilt when a weight changes. The fast path runs in eval
    mode without autograd (``torch.no_grad()`` or ``torch.inference_mode()``, or nothing requiring grad); in train
    mode, or when autograd records, the original modules run and gradients are torch's. Level ``"O0"`` only sets
    the compute dtype (bf16: autocast). ``sample_input`` (a tensor, a tuple of positional inputs, or a dict of
    keyword inputs) is run once under ``torch.no_grad()`` to build the kernels before the first real call.

    **Training** (``model.train()``).

    At level ``"O1"`` (the default):

    - ``dtype=torch.bfloat16``: the weights of Linear, Conv, ConvTranspose, Embedding, MultiheadAttention (and
      EmbeddingBag, LSTM, GRU, RNN where the running torch trains them in bf16 on this CPU) become split-BF16
      master weights: each parameter's data becomes its bf16 top half, which the model computes with, and the
      optimizer keeps the int16 bottom half, so the fp32 value is exact and never stored twice (see
      ``ember/_optimize/bf16_modules.py`` for what stays float32 and why). The forward runs under
      ``torch.autocast("cpu", dtype=torch.bfloat16)``, so fp32 inputs work as they are and the ops ember does not
      own follow autocast's rules; a surrounding autocast block is fine too. The optimizer is replaced by ember's
      fused one of the same kind, which updates the master weights in fp32 and splits them again in one pass.
      ``model.state_dict()`` gives the exact fp32 weights under the original keys and ``load_state_dict`` takes
      plain fp32 checkpoints; ``optimizer.state_dict()`` is torch.optim's. Convolution weights become
      channels-last, the layout oneDNN trains convolutions fastest in (``channels_last=False`` keeps theirs).
      ``nn.Dropout`` modules become ``ember.nn.Dropout``, whose mask comes from a parallel counter-based generator
      seeded from torch's and is not stored for backward, and ``nn.MultiheadAttention`` modules with dropout
      become ``ember.nn.MultiheadAttention``, whose attention dropout uses it (``replace_dropout=False`` keeps
      torch's).
    - ``dtype=None`` or ``torch.float32``: only the optimizer is replaced by ember's fused one.

    The optimizer is converted in place of its class (torch.optim SGD, Adam, AdamW, Adagrad become ember.optim's;
    ember.optim optimizers stay), so its param groups, state, hooks, and LR schedulers or GradScalers already
    bound to it carry over. Level ``"O0"`` changes nothing but the compute dtype: with bf16, the forward runs
    under autocast and the parameters and optimizer stay as they are.

    Args:
        model: the model: in train mode to train it, in eval mode for inference.
        dtype: None, ``torch.float32`` or ``torch.bfloat16``.
        optimizer: the model's optimizer; required for bf16 at level O1 (it holds the master weights' bottom halves).
        level: ``"O0"`` or ``"O1"``.
        inplace: change ``model`` and ``optimizer`` themselves. Otherwise they are copied first (for inference,
            the module tree and buffers: the copy's parameters share the original's memory, since the inference
            rewrite never writes them; for training, everything), and the weights that
            become split-BF16 are split straight from the originals, never copied in fp32 first.
        split_master_weight_for_bf16: keep bf16 master weights split (the only mode ember implements; False, an
            fp32 master copy, raises NotImplementedError).
        fuse_update_step: replace the optimizer by ember's fused one (False keeps it, with dtype None or float32).
        channels_last: give convolution weights (and so their activations) the channels-last layout, which
            oneDNN trains fastest in. None (the default): on for bf16 at level O1, off otherwise.
        replace_dropout: run dropout (``nn.Dropout`` modules, ``nn.MultiheadAttention``'s attention dropout) on
            ember's kernel: same probabilities, other random masks, several times faster. None (the default): on
            for bf16 at level O1, off otherwise.
        conv_bn_folding, linear_bn_folding, weights_prepack, replace_dropout_with_identity: inference rewrites
            (above); None (the default) follows the level (on at O1, off at O0). ``weights_prepack=False`` leaves
            Linears and convolutions to torch; ``True`` also packs Linear weights that could be read in place.
        sample_input: inference only: inputs to build the kernels with (above).
        report: print what was converted, what was left alone and why.
    """
    inference_flags = {
        "conv_bn_folding": conv_bn_folding,
        "linear_bn_folding": linear_bn_folding,
        "weights_prepack": weights_prepack,
        "replace_dropout_with_identity": replace_dropout_with_identity,
    }
    if isinstance(model, nn.Module) and not model.training:
        return _optimize_inference(
            model,
            dtype,
            optimizer,
            level,
            inplace,
            inference_flags,
            sample_input,
            report,
            training_flags={"channels_last": channels_last, "replace_dropout": replace_dropout},
        )
    inference_only = {**inference_flags, "sample_input": sample_input}
    if given := [name for name, value in inference_only.items() if value is not None]:
        raise ValueError(
            f"ember.optimize: {', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to inference (a model in "
            "eval mode); this model is in train mode"
        )
    bf16 = _check_dtype(dtype)
    _check_arguments(model, optimizer, level, bf16, split_master_weight_for_bf16, fuse_update_step)
    for name, flag in (("channels_last", channels_last), ("replace_dropout", replace_dropout)):
        if flag is not None and not isinstance(flag, bool):
            raise TypeError(f"ember.optimize: {name} must be None, True or False, got {flag!r}")
    if channels_last is None:
        channels_last = bf16 and level == "O1"
    if replace_dropout is None:
        replace_dropout = bf16 and level == "O1"
    replacement = None
    if optimizer is not None and level == "O1" and fuse_update_step:
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
    # The bottom halves live in the fused optimizer; checkpoint hooks and layout changes share its dict.
    bottoms = optimizer._bottoms() if isinstance(optimizer, ember_optim.FusedOptimizer) else {}
    if selection is not None:
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
    if report:
        print(log)
    return model if optimizer is None else (model, optimizer)


def _optimize_inference(
    model: nn.Module,
    dtype: Any,
    optimizer: Any,
    level: Any,
    inplace: bool,
    flags: dict[str, bool | None],
    sample_input: Any,
    report: bool,
    training_flags: dict[str, Any],
) -> nn.Module:
    bf16 = _check_dtype(dtype)
    if optimizer is not None:
        raise ValueError("ember.optimize: the model is in eval mode but an optimizer was given; call model.train()")
    if level not in _LEVELS:
        raise ValueError(f"ember.optimize: level must be one of {', '.join(_LEVELS)}, got {level!r}")
    if given := [name for name, value in training_flags.items() if value is not None]:
        raise ValueError(
            f"ember.optimize: {', '.join(given)} apply to training (a model in train mode); this model is in eval mode"
        )
    resolved = InferenceFlags.resolve(level, **flags)
    log = OptimizeReport()
    compute = torch.bfloat16 if bf16 else torch.float32
    model = optimize_for_inference(model, compute, resolved, inplace, sample_input, log)
    if report:
        print(log)
    return model


def _check_dtype(dtype: Any) -> bool:
    if dtype is None or dtype == torch.float32:
        return False
    if dtype == torch.bfloat16:
        return True
    raise ValueError(f"ember.optimize: dtype must be None, torch.float32 or torch.bfloat16, got {dtype!r}")


def _check_arguments(
    model: Any, optimizer: Any, level: Any, bf16: bool, split_master_weight_for_bf16: bool, fuse_update_step: bool
) -> None:
    """Every refusal, before anything is changed or copied."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"ember.optimize: model must be a torch.nn.Module, got {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"ember.optimize: optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if level not in _LEVELS:
        raise ValueError(f"ember.optimize: level must be one of {', '.join(_LEVELS)}, got {level!r}")
    check_forward_replaceable(model)
    if not (bf16 and level == "O1"):
        return
    if not split_master_weight_for_bf16:
        raise NotImplementedError(
            "ember.optimize: split_master_weight_for_bf16=False (an fp32 master copy beside bf16 weights) is not "
            "implemented; ember keeps bf16 master weights split, which gives the same results in less memory"
        )
    if optimizer is None:
        raise ValueError(
            "ember.optimize: bf16 training needs the optimizer (ember.optimize(model, optimizer=opt, "
            "dtype=torch.bfloat16)): it holds the bottom halves of the master weights"
        )
    if not fuse_update_step:
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
