"""Pooling on ember's kernels: ``max_pool2d`` / ``MaxPool2d``, ``avg_pool2d`` / ``AvgPool2d`` and
``adaptive_avg_pool2d`` / ``AdaptiveAvgPool2d`` (``torch.ops.ember.max_pool2d``, ``torch.ops.ember.avg_pool2d``),
drop-ins for torch's.

A convolutional network's max pool reads a channels-last activation (graph mode keeps convolutions channels-last).
torch's CPU kernel of a bf16 one converts and compares a vector at a time through generic code: ResNet-50's stem
pool, [16, 64, 112, 112], took 4.8-5.2 ms on two Sapphire Rapids cores where a read of its input at memory speed
takes about 1.2 ms (and 52 ms row-major). The kernel (csrc/pool) reads each window's channel vectors where they lie
and keeps torch's semantics: the window's largest element, NaN if it holds one, padding counting as -inf.

Averages (DenseNet's transitions, every squeeze-excitation's and every classifier head's global pool) sum each
window in float32 in torch's order and divide once by torch's divisor, so they are torch's to the bit. An adaptive
average whose output size divides the input's is the average over fixed windows (torch's adaptive windows are then
those); other output sizes take torch's.

float32 and bfloat16 CPU tensors whose channels have stride 1 (channels-last, or one channel) run on the kernels.
Other layouts and dtypes, ``return_indices=True``, and calls whose input wants a gradient (torch's backward of a max
needs the indices the kernel does not keep) take torch's functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ember import _C
from ember._library import define, dispatcher_needed, tracing
from ember._tensor import dlpack, sync_threads

__all__ = [
    "AdaptiveAvgPool2d",
    "AvgPool2d",
    "MaxPool2d",
    "adaptive_avg_pool2d",
    "avg_pool2d",
    "avg_pool2d_on_kernel",
    "max_pool2d",
    "max_pool2d_on_kernel",
]

_KERNEL_DTYPES = (torch.float32, torch.bfloat16)
IntPair = int | list[int] | tuple[int, ...]


def _pair(op: str, name: str, value: IntPair) -> list[int]:
    pair = [value, value] if isinstance(value, int) else list(value)
    if len(pair) == 1:
        pair = pair * 2
    if len(pair) != 2 or not all(isinstance(v, int) for v in pair):
        raise ValueError(f"{op}: {name} must be an int or a pair of ints, got {value!r}")
    return pair


def _window(
    op: str, kernel_size: IntPair, stride: IntPair | None, padding: IntPair
) -> tuple[list[int], list[int], list[int]]:
    """(kernel, stride, padding) as pairs, torch's way: no stride (None, or torch.max_pool2d's []) is the kernel's."""
    kernel = _pair(op, "kernel_size", kernel_size)
    no_stride = stride is None or (not isinstance(stride, int) and len(stride) == 0)
    strides = kernel if no_stride or stride is None else _pair(op, "stride", stride)
    # torch refuses these too, but in words that vary by version and input (torch 2.11 on an empty input: "integer
    # out of range", naming nothing), so ember says it first.
    for name, pair in (("kernel_size", kernel), ("stride", strides)):
        if min(pair) < 1:
            raise ValueError(f"{op}: {name} must be positive, got {pair}")
    return kernel, strides, _pair(op, "padding", padding)


def _output_size(size: Any, kernel: int, stride: int, padding: int, dilation: int, ceil_mode: bool) -> Any:
    """torch's output size along one dimension (pooling_output_shape); ``size`` may be symbolic. 0 for a window torch
    refuses (the kernel's check then names the error)."""
    if kernel < 1 or stride < 1 or dilation < 1:
        return 0
    out = (size + 2 * padding - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + padding:
        out = out - 1
    return out


def _output_sizes(x: torch.Tensor, kernel: list[int], stride: list[int], padding: list[int], dilation: list[int],
                  ceil_mode: bool) -> list[Any]:  # fmt: skip
    return [_output_size(x.shape[2 + d], kernel[d], stride[d], padding[d], dilation[d], ceil_mode) for d in range(2)]


def _channels_last_empty(x: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """A channels-last [N, C, sizes] tensor of x's dtype (torch.empty_strided: half the cost of torch.empty with a
    memory format, which a global pool at batch 1 pays on every call)."""
    n, c = x.shape[0], x.shape[1]
    h, w = sizes
    return torch.empty_strided((n, c, h, w), (h * w * c, 1, w * c, c), dtype=x.dtype)


def _kernel(
    x: torch.Tensor,
    kernel: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    ceil_mode: bool,
    relu: bool,
) -> torch.Tensor:
    # A geometry torch refuses gives a size below 1 here, and the kernel's check the error that names the operator.
    out = _channels_last_empty(x, [max(s, 0) for s in _output_sizes(x, kernel, stride, padding, dilation, ceil_mode)])
    sync_threads()
    _C.max_pool2d(dlpack(x), kernel, stride, padding, dilation, ceil_mode, relu, dlpack(out))
    return out


def _fake(
    x: torch.Tensor,
    kernel: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    ceil_mode: bool,
    relu: bool,
) -> torch.Tensor:
    sizes = _output_sizes(x, kernel, stride, padding, dilation, ceil_mode)
    return x.new_empty((x.shape[0], x.shape[1], *sizes)).contiguous(memory_format=torch.channels_last)


_op: Callable[..., torch.Tensor] = define(
    "max_pool2d(Tensor x, int[2] kernel, int[2] stride, int[2] padding, int[2] dilation, bool ceil_mode, "
    "bool relu) -> Tensor",
    _kernel,
    fake=_fake,
)


def _on_kernel(x: torch.Tensor) -> bool:
    """Whether the kernel takes ``x`` (a [N, C, H, W] or [C, H, W] tensor) as it lies."""
    if type(x) is not torch.Tensor and not isinstance(x, nn.Parameter):
        return False
    if not x.is_cpu or x.dtype not in _KERNEL_DTYPES or x.dim() not in (3, 4):
        return False
    if torch.is_grad_enabled() and x.requires_grad:
        return False
    channels = x.dim() - 3
    if 0 in x.shape[channels:]:
        return False  # no channel or an empty image: torch's answer (its result, or its error)
    return x.shape[channels] == 1 or x.stride(channels) == 1


def _on_kernel_call(op: Callable[..., torch.Tensor], kernel: Callable[..., torch.Tensor], x: torch.Tensor,
                    *args: Any) -> torch.Tensor | None:  # fmt: skip
    """``op(x, *args)`` where the kernel takes ``x`` (an unbatched x as a batch of one), its kernel function called
    directly where the dispatcher would add nothing; None where the kernel does not take ``x``."""
    if not _on_kernel(x):
        return None
    batched = x.dim() == 4
    x4 = x if batched else x.unsqueeze(0)
    out = op(x4, *args) if dispatcher_needed([x4], []) else kernel(x4, *args)
    return out if batched else out.squeeze(0)


def max_pool2d_on_kernel(
    x: torch.Tensor,
    kernel: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    ceil_mode: bool,
    relu: bool = False,
) -> torch.Tensor | None:
    """The kernel's result for ``x``, then ``max(., 0)`` with ``relu``; None where the kernel does not take ``x``
    (the caller computes torch's). Pairs as the kernel takes them; graph mode's pooling node calls this."""
    return _on_kernel_call(_op, _kernel, x, kernel, stride, padding, dilation, ceil_mode, relu)


def max_pool2d(
    input: torch.Tensor,  # noqa: A002 - torch's name
    kernel_size: IntPair,
    stride: IntPair | None = None,
    padding: IntPair = 0,
    dilation: IntPair = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Any:
    """``torch.nn.functional.max_pool2d`` on ember's kernel where it takes the input (see the module's doc), torch's
    otherwise; the same results (NaN propagated, padding as -inf), a channels-last result from the kernel."""
    if return_indices:
        return F.max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices=True)
    kernel, strides, pads = _window("max_pool2d", kernel_size, stride, padding)
    dilations = _pair("max_pool2d", "dilation", dilation)
    if tracing(input):
        return _op(input, kernel, strides, pads, dilations, bool(ceil_mode), False)
    out = max_pool2d_on_kernel(input, kernel, strides, pads, dilations, bool(ceil_mode))
    if out is None:
        return F.max_pool2d(input, kernel, strides, pads, dilations, ceil_mode)
    return out


class MaxPool2d(nn.MaxPool2d):
    """``torch.nn.MaxPool2d`` on ember's kernel (:func:`max_pool2d`); the same attributes and state."""

    def forward(self, input: torch.Tensor) -> Any:  # noqa: A002 - torch's name
        return max_pool2d(
            input, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode, self.return_indices
        )


# --- average pooling --------------------------------------------------------------------------------------------------


def _avg_kernel(
    x: torch.Tensor,
    kernel: list[int],
    stride: list[int],
    padding: list[int],
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: int,
) -> torch.Tensor:
    out = _channels_last_empty(x, [max(s, 0) for s in _output_sizes(x, kernel, stride, padding, [1, 1], ceil_mode)])
    sync_threads()
    _C.avg_pool2d(dlpack(x), kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, dlpack(out))
    return out


def _avg_fake(
    x: torch.Tensor,
    kernel: list[int],
    stride: list[int],
    padding: list[int],
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: int,
) -> torch.Tensor:
    sizes = _output_sizes(x, kernel, stride, padding, [1, 1], ceil_mode)
    return x.new_empty((x.shape[0], x.shape[1], *sizes)).contiguous(memory_format=torch.channels_last)


_avg_op: Callable[..., torch.Tensor] = define(
    "avg_pool2d(Tensor x, int[2] kernel, int[2] stride, int[2] padding, bool ceil_mode, bool count_include_pad, "
    "int divisor_override) -> Tensor",
    _avg_kernel,
    fake=_avg_fake,
)


def avg_pool2d_on_kernel(
    x: torch.Tensor,
    kernel: list[int],
    stride: list[int],
    padding: list[int],
    ceil_mode: bool,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> torch.Tensor | None:
    """The kernel's average for ``x``; None where the kernel does not take ``x`` (the caller computes torch's)."""
    args = (kernel, stride, padding, ceil_mode, count_include_pad, divisor_override or 0)
    return _on_kernel_call(_avg_op, _avg_kernel, x, *args)


def avg_pool2d(
    input: torch.Tensor,  # noqa: A002 - torch's name
    kernel_size: IntPair,
    stride: IntPair | None = None,
    padding: IntPair = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> torch.Tensor:
    """``torch.nn.functional.avg_pool2d`` on ember's kernel where it takes the input (see the module's doc), torch's
    otherwise; the same values, a channels-last result from the kernel."""
    kernel, strides, pads = _window("avg_pool2d", kernel_size, stride, padding)
    if divisor_override is not None and (type(divisor_override) is not int or divisor_override <= 0):
        raise ValueError(f"avg_pool2d: divisor_override must be a positive int or None, got {divisor_override!r}")
    if tracing(input):
        return _avg_op(input, kernel, strides, pads, bool(ceil_mode), bool(count_include_pad), divisor_override or 0)
    out = avg_pool2d_on_kernel(input, kernel, strides, pads, bool(ceil_mode), bool(count_include_pad), divisor_override)
    if out is None:
        return F.avg_pool2d(input, kernel, strides, pads, ceil_mode, count_include_pad, divisor_override)
    return out


def adaptive_window(x: torch.Tensor, output_size: Any) -> list[int] | None:
    """The fixed window (kernel = stride, no padding) torch's adaptive average of ``x`` to ``output_size`` uses where
    each output size divides the input's; None elsewhere (torch's windows then differ in size)."""
    sizes = [output_size, output_size] if isinstance(output_size, int) else list(output_size)
    if len(sizes) != 2 or x.dim() not in (3, 4):
        return None
    window = []
    for wanted, size in zip(sizes, x.shape[-2:]):
        wanted = size if wanted is None else wanted
        if type(wanted) is not int or wanted <= 0 or size % wanted != 0:
            return None
        window.append(size // wanted)
    return window


def adaptive_avg_pool2d(input: torch.Tensor, output_size: Any) -> torch.Tensor:  # noqa: A002 - torch's name
    """``torch.nn.functional.adaptive_avg_pool2d`` on ember's kernel where each output size divides the input's and
    the kernel takes the input; torch's otherwise."""
    if isinstance(input, torch.Tensor) and not tracing(input):
        window = adaptive_window(input, output_size)
        if window is not None:
            out = avg_pool2d_on_kernel(input, window, window, [0, 0], False)
            if out is not None:
                return out
    return F.adaptive_avg_pool2d(input, output_size)


class AvgPool2d(nn.AvgPool2d):
    """``torch.nn.AvgPool2d`` on ember's kernel (:func:`avg_pool2d`); the same attributes and state."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - torch's name
        return avg_pool2d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                          self.count_include_pad, self.divisor_override)  # fmt: skip


class AdaptiveAvgPool2d(nn.AdaptiveAvgPool2d):
    """``torch.nn.AdaptiveAvgPool2d`` on ember's kernel (:func:`adaptive_avg_pool2d`); the same attributes and
    state."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - torch's name
        return adaptive_avg_pool2d(input, self.output_size)
