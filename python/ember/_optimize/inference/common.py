"""What every inference fast path shares: when it may run, how an input reaches the compute dtype, and BatchNorm
folding."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ember import _C, bf16
from ember._compat import tracing_state
from ember._tensor import dlpack, sync_threads


def _probe_autocast_query() -> Callable[[], bool]:
    """torch >= 2.4 asks ``torch.is_autocast_enabled("cpu")`` and deprecates the older per-device function."""
    try:
        torch.is_autocast_enabled("cpu")
        return lambda: torch.is_autocast_enabled("cpu")
    except TypeError:
        return torch.is_autocast_cpu_enabled


cpu_autocast_enabled = _probe_autocast_query()


def cpu_autocast_takes(dtype: torch.dtype) -> bool:
    """Whether this torch's CPU autocast casts to ``dtype`` (bfloat16 always; float16 from torch 2.1 on)."""
    try:
        # torch 1.13 warns and turns autocast off for float16 (asked only where the CPU has AVX512-FP16): the answer
        # is the question, not a warning to its caller.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            with torch.autocast("cpu", dtype=dtype):
                return cpu_autocast_dtype() == dtype
    except RuntimeError:  # torch 1.13: "AutocastCPU only support Bfloat16"
        return False


def cpu_autocast_dtype() -> torch.dtype | None:
    """The dtype CPU autocast casts to now, or None when it is off."""
    if not cpu_autocast_enabled():
        return None
    get_dtype = getattr(torch, "get_autocast_dtype", None)  # torch >= 2.4; before it, the per-device function
    dtype: torch.dtype = get_dtype("cpu") if get_dtype is not None else torch.get_autocast_cpu_dtype()
    return dtype


_TRACER_NOTE = (
    "ember: torch.jit.trace of an ember-optimized model records torch's own operations for the layers ember fuses "
    "(ember's oneDNN layers are not TorchScript operators): the traced module computes the same results at torch's "
    "speed. For ember's speed, run the optimized module itself, or torch.compile it."
)
_tracer_warned = False


def jit_tracing() -> bool:
    """True while torch.jit.trace records this call. The fast paths call ember._C directly, which the tracer cannot
    see: it would record their outputs as constants, and the traced module would return those (or garbage)."""
    global _tracer_warned
    if tracing_state() is None:
        return False
    if not _tracer_warned:
        _tracer_warned = True
        warnings.warn(_TRACER_NOTE, UserWarning, stacklevel=4)
    return True


def fast_path_allowed(modules: Sequence[nn.Module], x: torch.Tensor) -> bool:
    """Eval mode, nothing autograd would have to differentiate through, and no torch.jit.trace recording (see
    :func:`jit_tracing`). (Plain loops over ``_parameters``: this runs on every call of every layer, and
    generators and ``parameters()`` cost microseconds there.)"""
    for m in modules:
        if m.training:
            return False
    verdict = _call_verdict(x)
    if verdict is not None:
        return verdict
    for m in modules:
        for p in m._parameters.values():
            if p is not None and p.requires_grad:
                return False
    return True


def tensors_allow_fast_path(tensors: Sequence[torch.Tensor | None], x: torch.Tensor) -> bool:
    """:func:`fast_path_allowed` for a layer that has tensors rather than modules (a graph's fused node): nothing
    autograd would differentiate through, no torch.jit.trace recording."""
    verdict = _call_verdict(x)
    if verdict is not None:
        return verdict
    for t in tensors:  # noqa: SIM110 - on every call; a generator costs more
        if t is not None and t.requires_grad:
            return False
    return True


def _call_verdict(x: torch.Tensor) -> bool | None:
    """What the call alone decides: False while a trace records or x requires grad, True with autograd off; None
    when the layer's own tensors decide (autograd on, x without grad)."""
    if jit_tracing():
        return False
    if not torch.is_grad_enabled():
        return True
    if x.requires_grad:
        return False
    return None


def _global_hook_dicts() -> tuple[dict[Any, Any], ...]:
    # torch keeps hooks registered with nn.modules.module.register_module_forward_(pre_)hook in these module-level
    # dicts (every torch from 1.13 on); a torch without them has none to skip.
    from torch.nn.modules import module as module_mod

    names = ("_global_forward_hooks", "_global_forward_pre_hooks")
    return tuple(d for d in (getattr(module_mod, name, None) for name in names) if isinstance(d, dict))


_GLOBAL_HOOKS = _global_hook_dicts()


def hooks_would_be_skipped(modules: Sequence[nn.Module]) -> bool:
    """Whether a fused call that runs ``modules`` without calling them would skip forward hooks: theirs, or the
    global ones every module call runs. The fused forward then calls the modules instead, so hooks see what they
    would see in the original model."""
    for d in _GLOBAL_HOOKS:
        if d:
            return True
    for m in modules:  # noqa: SIM110 - a generator under any() costs more on this per-call path
        if m._forward_hooks or m._forward_pre_hooks:
            return True
    return False


_MISSING = object()


def parameter(module: nn.Module, name: str) -> torch.Tensor | None:
    """``getattr(module, name)`` for a parameter or buffer, reading the module's registries directly:
    nn.Module.__getattr__ costs 1-2 us a call, on every layer's hot path. A name that is neither (a parametrization's
    property, a plain tensor attribute) is read with getattr."""
    p = module._parameters.get(name, _MISSING)
    if p is _MISSING:
        p = module._buffers.get(name, _MISSING)  # a BatchNorm's statistics
        if p is _MISSING:
            p = getattr(module, name)
    return cast("torch.Tensor | None", p)


def install_forwards(model: nn.Module, wants: Callable[[nn.Module], bool], make: Callable[[nn.Module], Any]) -> int:
    """Installs ``make(module)`` as the forward of every module of ``model`` that ``wants`` and whose forward ember
    has not replaced yet; returns how many."""
    count = 0
    for module in model.modules():
        if wants(module) and "forward" not in module.__dict__:
            module.__dict__["forward"] = make(module)
            count += 1
    return count


def class_forward(module: nn.Module, *args: Any) -> torch.Tensor:
    """The forward of the module's class, bypassing the one ember installed on the instance: what torch would run."""
    out: torch.Tensor = type(module).forward(module, *args)
    return out


def tensor_of(module: nn.Module, name: str) -> torch.Tensor:
    """A tensor the layer cannot run without (its weight, a BatchNorm's statistics), read as :func:`parameter`
    reads it; TypeError naming it when the module has none."""
    t = parameter(module, name)
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"ember: {type(module).__name__}.{name} is {type(t).__name__}, not a tensor")
    return t


def dense_strides(shape: Sequence[int], order: Sequence[int] | None = None) -> tuple[int, ...]:
    """The strides of a dense tensor of ``shape`` whose dimensions lie in memory in ``order`` (outermost first;
    row-major when None), as torch.empty gives them."""
    strides = [0] * len(shape)
    step = 1
    for d in reversed(order if order is not None else range(len(shape))):
        strides[d] = step
        step *= max(shape[d], 1)
    return tuple(strides)


def takes_dtype(dtype: torch.dtype, compute: torch.dtype) -> bool:
    """Whether a layer computing in ``compute`` takes inputs of ``dtype``: its own, and fp32 for a bf16 or fp16
    layer (converted the way autocast would). Inputs of other dtypes are torch's to run (and to refuse)."""
    return dtype == compute or (compute != torch.float32 and dtype == torch.float32)


def defers_to_autocast(compute: torch.dtype) -> bool:
    """Whether torch runs this call: an fp32 layer under a bf16 autocast computes what autocast says, in bf16."""
    return compute == torch.float32 and cpu_autocast_enabled()


def in_compute_dtype(x: torch.Tensor, convert: bool, compute: torch.dtype) -> torch.Tensor | None:
    """``x`` as a layer computing in ``compute`` takes it (converted when its plan says so), or None when torch runs
    the call (:func:`defers_to_autocast`)."""
    if convert:
        # ember's rounding (ember.bf16.round, the same as x.to(torch.bfloat16)) where the input is contiguous: an fp32
        # residual stream (autocast keeps one) is converted before every bf16 layer that reads it, three times per
        # transformer block, and at batch 1 torch's copy kernel took ~30 us on the 16-core Xeon for a few us of
        # memory traffic (docs/reliability.md).
        if compute == torch.bfloat16 and x.dtype == torch.float32 and not x.is_contiguous() and is_dense(x):
            return _rounded_in_layout(x)  # (a channels-last activation: rounded where it lies, its strides kept)
        return bf16.round(x) if compute == torch.bfloat16 and x.is_contiguous() else x.to(compute)
    return None if defers_to_autocast(compute) else x


def is_dense(x: torch.Tensor) -> bool:
    """The elements fill one run of memory in some order of the dimensions (channels-last, a permuted tensor)."""
    expected = 1
    for stride, size in sorted((st, s) for s, st in zip(x.shape, x.stride()) if s != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _rounded_in_layout(x: torch.Tensor) -> torch.Tensor:
    """A dense float32 ``x`` rounded to bf16 by ember's kernel, into a tensor of its strides (what ``x.to`` gives)."""
    out = torch.empty_strided(x.shape, x.stride(), dtype=torch.bfloat16)
    sync_threads()
    _C.bf16_round(dlpack(x), dlpack(out))
    return out


def foldable_batchnorm(bn: nn.Module, channels: int, kinds: tuple[type[_BatchNorm], ...]) -> bool:
    """A BatchNorm of one of ``kinds`` whose eval-mode output is an affine map of its input, per channel: it has
    running statistics, over ``channels`` channels."""
    return (
        isinstance(bn, kinds)
        and bn.track_running_stats
        and isinstance(bn.running_mean, torch.Tensor)
        and isinstance(bn.running_var, torch.Tensor)
        and bn.num_features == channels
    )


def fold_batchnorm(
    weight: torch.Tensor, bias: torch.Tensor | None, norm: tuple[torch.Tensor | None, ...], eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weight and bias of ``batch_norm(layer(x))`` as one affine layer, for a layer whose output channels are the
    weight's dimension 0 (Linear, Conv); ``norm`` is the BatchNorm's (weight, bias, running_mean, running_var), as
    ``FoldedBatchNorm.tensors()`` gives them. Computed in float64, returned in float32."""
    bn_weight, bn_bias, running_mean, running_var = norm
    assert running_mean is not None and running_var is not None  # foldable_batchnorm checked
    scale = torch.rsqrt(running_var.double() + eps)
    if bn_weight is not None:
        scale = scale * bn_weight.double()
    shift = -running_mean.double() * scale
    if bn_bias is not None:
        shift = shift + bn_bias.double()
    w = weight.double() * scale.reshape(-1, *([1] * (weight.dim() - 1)))
    b = shift if bias is None else bias.double() * scale + shift
    return w.float(), b.float()


def fold_channel_scale(
    weight: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Weight and bias of ``layer(x) * scale`` as one layer, ``scale`` one factor per output channel (the weight's
    dimension 0; any shape holding that many elements). Computed in float64, returned in float32."""
    factor = scale.double().reshape(-1)
    w = weight.double() * factor.reshape(-1, *([1] * (weight.dim() - 1)))
    return w.float(), None if bias is None else (bias.double() * factor).float()


def as_kernel_dtype(t: torch.Tensor) -> torch.Tensor:
    """A weight or bias as the kernels take it: float32 or bfloat16 (float64 or float16 parameters in float32)."""
    return t if t.dtype in (torch.float32, torch.bfloat16) else t.float()
