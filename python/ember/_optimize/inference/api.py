"""``ember.optimize(model.eval(), ...)``: the inference rewrite.

Nothing here replaces a parameter or a module. Each rewritten layer gets a forward installed on the instance
(``module.forward``), which holds the layer's oneDNN kernel as a cache built from the parameters; containers get
a forward that runs their fusable runs of modules as one call. The model's ``state_dict()``, ``parameters()``,
module tree and classes stay what they were, and every installed forward falls back to the class's own whenever
the fast path does not apply (train mode, autograd, inputs the kernel does not take).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ember import _C
from ember._optimize.autocast_forward import (
    AutocastForward,
    check_forward_replaceable,
    install_autocast_forward,
)
from ember._optimize.fused_fast_paths import keep_off_fused_kernels, kept_off_note
from ember._optimize.inference.common import tensor_of
from ember._optimize.inference.containers import fuse_known_containers
from ember._optimize.inference.conv import CONVOLUTIONS, TRANSPOSED, ConvForward, geometry_of
from ember._optimize.inference.dropout import remove_dropout
from ember._optimize.inference.linear import LinearForward, layer_state, runs_in_place
from ember._optimize.inference.mixed_norms import let_norms_take_bf16
from ember._optimize.inference.pooling import use_ember_pools
from ember._optimize.inference.sequential import FoldFlags, fuse_sequentials
from ember._optimize.inference.state import COMPUTE_NAMES, LayerState
from ember._optimize.report import OptimizeReport
from ember._optimize.scripting import make_scriptable
from ember._optimize.vision_modules import use_ember_vision_ops


@dataclass(frozen=True)
class InferenceFlags:
    """What the inference rewrite does; None in the user's flags means "as the level says"."""

    conv_bn_folding: bool
    linear_bn_folding: bool
    weights_prepack: bool
    replace_dropout_with_identity: bool
    # weights_prepack=True given explicitly: Linear weights get packed copies even where they could be read in place.
    pack_every_weight: bool = False

    @staticmethod
    def resolve(level: str, **flags: bool | None) -> InferenceFlags:
        default = level == "O1"
        for name, value in flags.items():
            if value is not None and not isinstance(value, bool):
                raise TypeError(f"ember.optimize: {name} must be None, True or False, got {value!r}")
        resolved = {name: default if value is None else value for name, value in flags.items()}
        return InferenceFlags(**resolved, pack_every_weight=flags.get("weights_prepack") is True)


def prepare_for_inference(model: nn.Module, inplace: bool, compute: torch.dtype, log: OptimizeReport) -> nn.Module:
    """The model the rewrite works on: ``model`` itself, or (``inplace=False``) a copy sharing its parameters. For a
    reduced-precision ``compute``, kept off the fused kernels this torch cannot run under CPU autocast before
    anything runs it there: graph capture and its sample run do, as the optimized forward will."""
    check_forward_replaceable(model)
    if not inplace:
        log.actions.append("copied the module tree (inplace=False); the parameters share the original's memory")
        model = copy_sharing_parameters(model)
    if compute != torch.float32 and (note := kept_off_note(*keep_off_fused_kernels(model))):
        log.actions.append(note)
    return model


def rewrite_modules(model: nn.Module, compute: torch.dtype, flags: InferenceFlags, log: OptimizeReport) -> None:
    """The module-level rewrite: a forward on each Linear, convolution and pool, and fused forwards on the
    containers whose fusable runs of modules it knows."""
    if not flags.weights_prepack:
        return
    _install_linear_forwards(model, compute, flags.pack_every_weight, log)
    _install_conv_forwards(model, compute, log)
    if pools := use_ember_pools(model):
        log.actions.append(f"{pools} pooling module(s) run ember's pools (on channels-last inputs)")
    fused, folded = fuse_sequentials(model, FoldFlags(flags.linear_bn_folding, flags.conv_bn_folding))
    if fused:
        log.actions.append(
            f"{fused} layer(s) in nn.Sequential fused with what follows them"
            + (f" ({folded} BatchNorm(s) folded into the weights)" if folded else "")
        )
    if containers := fuse_known_containers(model, flags.conv_bn_folding):
        counts = {name: containers.count(name) for name in dict.fromkeys(containers)}
        log.actions.append("fused inside known containers: " + ", ".join(f"{n} {name}" for name, n in counts.items()))
    log.actions.append(_weight_memory(model, compute))


def finish_for_inference(
    model: nn.Module, compute: torch.dtype, flags: InferenceFlags, sample_input: Any, log: OptimizeReport
) -> nn.Module:
    """What follows the rewrite of the layers: torchvision's ops, dropout, the bf16 forward under autocast (around
    whatever forward the model has now), TorchScript's twin, and the warm-up on ``sample_input``."""
    if swapped := use_ember_vision_ops(model):
        log.actions.append(f"{swapped} torchvision FrozenBatchNorm2d / RoIAlign module(s) -> ember.nn's")
    if flags.replace_dropout_with_identity and (removed := remove_dropout(model)):
        log.actions.append(f"{removed} dropout module(s) are the identity in eval mode (torch's dropout in train)")
    if compute != torch.float32:
        if compute == torch.bfloat16 and (norms := let_norms_take_bf16(model)):
            log.actions.append(f"{norms} LayerNorm / GroupNorm module(s) normalize bf16 activations in fp32 (this "
                               "torch refuses a bf16 input beside fp32 weights)")  # fmt: skip
        inner = model.__dict__.get("forward")
        if isinstance(inner, AutocastForward):  # optimized before
            inner = inner.inner
        install_autocast_forward(model, compute, inner=inner)
        log.actions.append(f"forward runs under torch.autocast('cpu', dtype={compute})")
    make_scriptable(model)
    if sample_input is not None:
        _warm_up(model, sample_input)
        log.actions.append("ran sample_input once (kernels built and primitives cached for its shapes)")
    return model


def copy_sharing_parameters(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` whose parameters are new Parameter objects over the original's memory.

    The inference rewrite never writes a parameter, so copying the weights would only double the model's memory
    (and, for a model that barely fits, fail) to keep two equal copies. Each parameter gets its own Parameter
    object, so what torch does to the copy by replacing a tensor (``.to()``, ``.half()``, ``load_state_dict``
    with ``assign=True``, ``p.data = ...``) leaves the original as it was; a write into the memory itself (an
    optimizer step on the copy put back into training, ``p.data.mul_()``) shows in both, as with
    ``torch.compile``. Buffers (BatchNorm statistics, which train mode updates in place) and everything else are
    deep-copied."""
    memo: dict[int, Any] = {}
    for p in model.parameters():
        if type(p) is not nn.Parameter:  # a subclass (a lazy module's UninitializedParameter) is deep-copied
            continue
        shared = nn.Parameter(p.detach(), requires_grad=p.requires_grad)
        if p.grad is not None:
            shared.grad = p.grad.clone()
        memo[id(p)] = shared
    return copy.deepcopy(model, memo)


def _is_hf_conv1d(module: nn.Module) -> bool:
    """Hugging Face transformers' Conv1D (GPT-2's Linear with a [in, out] weight)."""
    kind = type(module)
    return kind.__name__ == "Conv1D" and kind.__module__.startswith("transformers.")


def _eligible(name: str, module: nn.Module, supported: bool, kernel: str, log: OptimizeReport) -> bool:
    """Whether ember can take the layer over; says why not in the report."""
    if not supported:
        log.left.append((name, f"oneDNN has no {kernel} on this CPU; torch runs it"))
    elif "forward" in module.__dict__:
        log.left.append((name, "its forward is already replaced on the instance"))
    elif not (weight := tensor_of(module, "weight")).is_floating_point() or weight.device.type != "cpu":
        log.left.append((name, f"{weight.dtype} weight on {weight.device}"))
    else:
        return True
    return False


def _install_linear_forwards(model: nn.Module, compute: torch.dtype, pack: bool, log: OptimizeReport) -> None:
    supported = _C.Linear.supported(COMPUTE_NAMES[compute])
    attention_projections = {
        id(m.out_proj) for m in model.modules() if isinstance(m, nn.MultiheadAttention) and hasattr(m, "out_proj")
    }
    converted = 0
    for name, module in model.named_modules():
        if not (type(module) is nn.Linear or _is_hf_conv1d(module)):
            if isinstance(module, nn.Linear) and id(module) not in attention_projections:
                log.left.append((name, f"{type(module).__name__} subclasses nn.Linear; its forward may differ"))
            continue
        if id(module) in attention_projections:
            continue  # MultiheadAttention reads out_proj's weight itself and never calls its forward
        if not _eligible(name, module, supported, f"{COMPUTE_NAMES[compute]} matmul", log):
            continue
        module.__dict__["forward"] = LinearForward(module, layer_state(module, compute, pack))
        converted += 1
    if converted:
        log.actions.append(
            f"{converted} Linear layer(s) run in {compute} on ember's skinny matmul (a few rows) or oneDNN's matmul"
        )


def _install_conv_forwards(model: nn.Module, compute: torch.dtype, log: OptimizeReport) -> None:
    supported = _C.Convolution.supported(COMPUTE_NAMES[compute])
    converted = 0
    for name, module in model.named_modules():
        if type(module) not in CONVOLUTIONS + TRANSPOSED:
            if isinstance(module, CONVOLUTIONS + TRANSPOSED):
                log.left.append(
                    (name, f"{type(module).__name__} subclasses a torch convolution; its forward may differ")
                )
            continue
        if not _eligible(name, module, supported, f"{COMPUTE_NAMES[compute]} convolution", log):
            continue
        geometry = geometry_of(module)
        if isinstance(geometry, str):
            log.left.append((name, geometry))
            continue
        module.__dict__["forward"] = ConvForward(module, LayerState.of_module(module, compute), geometry)
        converted += 1
    if converted:
        log.actions.append(
            f"{converted} convolution(s) run on oneDNN, weights prepacked in {compute}, activations channels-last"
        )


def _weight_memory(model: nn.Module, compute: torch.dtype) -> str:
    """What the rewritten layers' weights cost: read in place, or packed into a cache at their first call."""
    in_place = packed = 0
    itemsize = torch.empty((), dtype=compute).element_size()
    for module in model.modules():
        forward = module.__dict__.get("forward")
        if not isinstance(forward, (LinearForward, ConvForward)):
            continue
        weight = tensor_of(module, "weight")
        if isinstance(forward, LinearForward) and runs_in_place(forward.state):
            in_place += weight.numel() * weight.element_size()
        else:
            packed += weight.numel() * itemsize
    mib = 2**20
    return (
        f"weights: {in_place / mib:.1f} MiB read where they are, {packed / mib:.1f} MiB to be packed in {compute} "
        "at the layers' first calls"
    )


def _warm_up(model: nn.Module, sample_input: Any) -> None:
    with torch.no_grad():
        if isinstance(sample_input, dict):
            model(**sample_input)
        elif isinstance(sample_input, (tuple, list)):
            model(*sample_input)
        else:
            model(sample_input)
