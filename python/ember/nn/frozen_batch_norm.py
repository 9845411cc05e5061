"""Frozen batch norm (torchvision.ops.FrozenBatchNorm2d) on ember's kernel: ``torch.ops.ember.frozen_batch_norm``.

Detection backbones freeze their batch norms: four buffers, no statistics updates, no parameters. torchvision
computes ``x * scale + shift`` as two broadcast passes over the activation (and, for a bf16 activation with float32
buffers, a float32 result: torch's type promotion, which ember keeps); the kernel (csrc/norm) makes one pass, in
x's own layout, row-major or channels-last.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ember import _C
from ember._library import define, needs_input_grad, tracing
from ember._tensor import arithmetic_dtype, dlpack, memory_order, sync_threads

__all__ = ["FrozenBatchNorm2d", "frozen_batch_norm"]

_KERNEL_DTYPES = (torch.float32, torch.bfloat16)  # for x and the buffers alike; or float64 for all of them


def _dense(x: torch.Tensor) -> torch.Tensor:
    """x if the kernel can walk it (row-major or channels-last), else a row-major copy."""
    if x.is_contiguous():
        return x
    order = memory_order(x)
    return x if order is not None and order[-1] == 1 else x.contiguous()


def _buffer(dtype: torch.dtype, buffer: torch.Tensor) -> Any:
    """A statistic or affine buffer as the kernel reads it: contiguous, in x's arithmetic dtype."""
    return dlpack(buffer.detach().to(arithmetic_dtype(dtype)).contiguous())


def _forward_kernel(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    x = _dense(x)
    out = torch.empty_like(x, dtype=torch.result_type(x, weight))
    sync_threads()
    d = x.dtype
    _C.frozen_batch_norm(
        dlpack(x), _buffer(d, weight), _buffer(d, bias), _buffer(d, running_mean), _buffer(d, running_var), eps,
        dlpack(out),
    )  # fmt: skip
    return out


def _forward_fake(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    return torch.empty_like(x, dtype=torch.result_type(x, weight))


def _backward_kernel(grad: torch.Tensor, weight: torch.Tensor, running_var: torch.Tensor, eps: float) -> torch.Tensor:
    grad = _dense(grad)
    out = torch.empty_like(grad)
    sync_threads()
    d = grad.dtype
    _C.frozen_batch_norm_backward(dlpack(grad), _buffer(d, weight), _buffer(d, running_var), eps, dlpack(out))
    return out


def _backward_fake(grad: torch.Tensor, weight: torch.Tensor, running_var: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty_like(grad)


_backward_op: Callable[..., torch.Tensor] = define(
    "frozen_batch_norm_backward(Tensor grad, Tensor weight, Tensor running_var, float eps) -> Tensor",
    _backward_kernel,
    fake=_backward_fake,
)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    x, weight, _, _, running_var, eps = inputs
    ctx.x_dtype = x.dtype
    ctx.save_for_backward(weight, running_var)
    ctx.eps = eps


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    weight, running_var = ctx.saved_tensors
    wanted = needs_input_grad(ctx)
    if any(wanted[1:5]):  # frozen_batch_norm() sends such calls to torchvision's formula; the operator refuses them
        raise RuntimeError("ember.frozen_batch_norm differentiates x only: weight, bias, running_mean and "
                           "running_var are constants of a frozen norm (call ember.nn.functional.frozen_batch_norm, "
                           "which differentiates them through torch's formula)")  # fmt: skip
    grad_x = None
    if wanted[0]:
        grad_x = _backward_op(grad, weight, running_var, ctx.eps).to(ctx.x_dtype)
    return grad_x, None, None, None, None, None


_forward_op: Callable[..., torch.Tensor] = define(
    "frozen_batch_norm(Tensor x, Tensor weight, Tensor bias, Tensor running_mean, Tensor running_var, float eps) "
    "-> Tensor",
    _forward_kernel,
    fake=_forward_fake,
    backward=_backward,
    setup_context=_setup_context,
)


def frozen_batch_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    eps: float = 1e-5,
) -> torch.Tensor:
    """``x * scale + shift`` per channel (dimension 1), scale = weight * rsqrt(running_var + eps), shift = bias -
    running_mean * scale: torchvision's FrozenBatchNorm2d. float32 and bfloat16 CPU tensors run on the kernel, and
    float64 ones (x and every buffer) on its double path; others take torchvision's formula."""
    if tracing(x):
        return _forward_op(x, weight, bias, running_mean, running_var, float(eps))
    if x.dim() < 2:
        raise ValueError(f"frozen_batch_norm: x must be at least 2-D ([N, C, ...]), got {x.dim()}-D")
    buffers = (weight, bias, running_mean, running_var)
    # The operator differentiates x only: the statistics of a frozen norm are constants. A weight, bias or
    # statistic that requires grad (someone unfroze it) takes torchvision's formula, which autograd differentiates.
    grad_of_buffers = torch.is_grad_enabled() and any(b.requires_grad for b in buffers)
    kernel = (
        not grad_of_buffers
        and x.device.type == "cpu"
        and (
            (x.dtype in _KERNEL_DTYPES and all(b.dtype in _KERNEL_DTYPES for b in buffers))
            or (x.dtype == torch.float64 and all(b.dtype == torch.float64 for b in buffers))
        )
    )
    if not kernel:
        shape = [1, -1] + [1] * (x.dim() - 2)
        # Half statistics are combined in float32 (torch 1.13 has no CPU rsqrt for float16), then the usual promotion.
        low = [b.float() if b.dtype == torch.float16 else b for b in buffers]
        scale = low[0] * (low[3] + eps).rsqrt()
        shift = low[1] - low[2] * scale
        dtype = torch.result_type(x, weight)
        return x * scale.reshape(shape).to(dtype) + shift.reshape(shape).to(dtype)
    return _forward_op(x, weight, bias, running_mean, running_var, float(eps))


class FrozenBatchNorm2d(nn.Module):
    """torchvision.ops.FrozenBatchNorm2d on ember's kernel: the same buffers (``weight``, ``bias``,
    ``running_mean``, ``running_var``), ``eps``, state_dict (``num_batches_tracked`` dropped on load) and repr.

    ``ember.optimize`` swaps torchvision's modules for this one; ``FrozenBatchNorm2d.from_module(m)`` does it by
    hand (the buffers are shared, not copied).
    """

    weight: torch.Tensor
    bias: torch.Tensor
    running_mean: torch.Tensor
    running_var: torch.Tensor

    def __init__(self, num_features: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", torch.ones(num_features))
        self.register_buffer("bias", torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    @classmethod
    def from_module(cls, module: nn.Module) -> FrozenBatchNorm2d:
        """This module for another with the same four buffers and eps (torchvision's FrozenBatchNorm2d)."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.eps = float(module.eps)  # type: ignore[arg-type]  # a float attribute of the module given
        for name in ("weight", "bias", "running_mean", "running_var"):
            new.register_buffer(name, getattr(module, name))
        return new

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: Any,
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        state_dict.pop(prefix + "num_batches_tracked", None)  # a BatchNorm2d checkpoint loads, as in torchvision
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return frozen_batch_norm(x, self.weight, self.bias, self.running_mean, self.running_var, self.eps)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.weight.shape[0]}, eps={self.eps})"
