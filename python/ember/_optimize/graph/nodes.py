"""The modules graph mode puts into a captured graph: a Linear or convolution on ember's kernels, with what the passes
fused into it (a folded BatchNorm, elementwise steps, a residual add or a multiplication by a tensor).

Each reads its weights where the model holds them (:class:`~ember._optimize.inference.state.TensorRef`), or, in a
graph that passes the model's parameters as inputs (dynamo's), takes them as arguments of its call after the
epilogue's tensor operand: either way the model's parameters stay the only copy and a changed one is seen. Each
falls back to torch's own operations, in the graph's order, whenever the kernel does not take a call: autograd, a
dtype or shape the kernel does not run, torch.jit.trace recording.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ember._optimize.graph.epilogue import Step, apply_steps
from ember._optimize.graph.fast_calls import CHECKED, FastConv, FastLinear
from ember._optimize.inference import conv, linear
from ember._optimize.inference.common import tensors_allow_fast_path
from ember._optimize.inference.conv import Geometry
from ember._optimize.inference.state import LayerState, MergedLayerState

Tensors = tuple[Optional[torch.Tensor], ...]  # (a runtime alias: no `X | None` before Python 3.10)


class FusedLayer(nn.Module):
    """What the fused Linear and convolution share: the state, the steps after the layer, and the fallback."""

    def __init__(self, state: LayerState, origin: str) -> None:
        super().__init__()
        self.state = state
        self.origin = origin  # the graph node it replaced, for the report and repr
        self.steps: tuple[Step, ...] = ()
        self.entries: tuple[str, ...] = ()
        # The graph reshaped the layer's output before adding the operand (Hugging Face's Conv1D restores its rows
        # after the GEMM): the operand is read in the layer's own rows, as x's leading dimensions and its last.
        self.operand_reshaped = False
        # The graph permuted the layer's output before adding the operand (ConvNeXt's blocks add their input to
        # their last Linear's output permuted back to [N, C, H, W]): the operand is read in the layer's own layout,
        # as operand.permute(operand_permuted), the inverse permutation (fuse_epilogue.py).
        self.operand_permuted: tuple[int, ...] | None = None
        # The graph converted the layer's input to this dtype before it (graph/absorb_casts.py took the conversion
        # in): a bf16 input is read as it is on the bf16 kernel, where converting it to float32 and back would give
        # the same numbers; every other call converts it first, as the graph did.
        self.input_cast: torch.dtype | None = None

    def append(self, step: Step) -> None:
        self.steps = (*self.steps, step)
        self.entries = tuple(s.entry for s in self.steps)

    @property
    def has_operand(self) -> bool:
        """Whether a step reads a tensor operand (a residual add, a multiplication by a tensor): at most one may."""
        return any(step.takes_operand for step in self.steps)

    def forward(self, x: torch.Tensor, operand: Any = None, *passed: torch.Tensor | None) -> torch.Tensor:
        """``x``, the steps' tensor operand (or None), then, in a graph that passes them, the layer's tensors in
        :meth:`LayerState.tensors`' order."""
        cast = self.input_cast
        if cast is not None and x.dtype != cast and not (x.dtype == self.state.compute == torch.bfloat16):
            x = x.to(cast)
        if self.operand_permuted is not None and isinstance(operand, torch.Tensor):
            operand = operand.permute(self.operand_permuted)
        cache = self.state.cache
        if cache.checked == CHECKED.epoch and not passed:  # checked by this forward's guard (fast_calls.py)
            fast = cache.fast
            if fast is not None:
                out: torch.Tensor | None = fast(x, operand)
                if out is not None:
                    return out
        tensors = passed if passed else self.state.tensors()
        plain = isinstance(x, torch.Tensor) and (operand is None or isinstance(operand, torch.Tensor))
        if plain and self.operand_reshaped and operand is not None:
            operand = operand.reshape(*x.shape[:-1], operand.shape[-1])
        if plain and tensors_allow_fast_path(tensors, x):  # (the graph runs in eval mode only)
            out = self.on_kernel(x, operand, tensors)
            if out is not None:
                if not passed:
                    cache.fast = self.fast_call(x, operand, out)
                return out
        return self.in_torch(x, operand, tensors)

    def fast_call(self, x: torch.Tensor, operand: torch.Tensor | None, out: torch.Tensor) -> Any:
        """The call for inputs like ``x`` and ``operand``, which the kernel has just run into ``out``, inside a
        checked forward (fast_calls.py); None where only the general call takes them."""
        raise NotImplementedError

    def on_kernel(self, x: torch.Tensor, operand: torch.Tensor | None, tensors: Tensors) -> torch.Tensor | None:
        raise NotImplementedError

    def layer_in_torch(self, x: torch.Tensor, tensors: Tensors) -> torch.Tensor:
        raise NotImplementedError

    def in_torch(self, x: torch.Tensor, operand: Any, tensors: Tensors) -> torch.Tensor:
        """What the graph computed before fusing, in its order."""
        if self.input_cast is not None and x.dtype != self.input_cast:
            x = x.to(self.input_cast)
        out = self.layer_in_torch(x, tensors)
        bn = self.state.bn
        if bn is not None:
            weight, bias, mean, var = tensors[2:6]
            out = F.batch_norm(out, mean, var, weight, bias, False, 0.0, bn.eps)
        scale = self.state.scale_of(tensors)
        if scale is not None:  # only Linears fold a scale (fold_scales.py): their channels are the last dimension
            out = out * scale.reshape(-1)
        return apply_steps(self.steps, out, operand)

    def extra_repr(self) -> str:
        folded = f", folds {self.state.bn.name}" if self.state.bn is not None else ""
        if self.state.scale is not None:
            folded += ", folds a scale"
        steps = f", then {' -> '.join(self.entries)}" if self.entries else ""
        return f"{self.origin}, {self.state.compute}{folded}{steps}"


class FusedLinear(FusedLayer):
    """``steps(batch_norm(x @ weight.T + bias))`` on ember's matmul kernels (csrc/linear/)."""

    def on_kernel(self, x: torch.Tensor, operand: torch.Tensor | None, tensors: Tensors) -> torch.Tensor | None:
        return linear.run(self.state, x, self.entries, operand, tensors)

    def fast_call(self, x: torch.Tensor, operand: torch.Tensor | None, out: torch.Tensor) -> FastLinear | None:
        return FastLinear.of(x, operand, out, self.state, self.entries, self.operand_reshaped)

    def layer_in_torch(self, x: torch.Tensor, tensors: Tensors) -> torch.Tensor:
        return F.linear(x, self.state.weight_of(tensors), tensors[1])


class FusedMergedLinear(FusedLinear):
    """Several Linears that read one input as one GEMM (:class:`MergedLayerState`): ``x @ cat(weights).T +
    cat(biases)``, the parts' outputs side by side along the last dimension (the graph slices them apart)."""

    state: MergedLayerState

    def layer_in_torch(self, x: torch.Tensor, tensors: Tensors) -> torch.Tensor:
        return F.linear(x, self.state.weight_of(tensors), self.state.bias_of(tensors))

    def extra_repr(self) -> str:
        return f"{self.origin}, {self.state.compute}, {len(self.state.parts)} Linears merged"


@dataclass(frozen=True)
class ConvCall:
    """A convolution as torch's functional call computes it: the function's name in torch.nn.functional and its
    arguments after input, weight and bias; ``pre_pad`` is a padding mode other than zeros, applied first."""

    function: str
    arguments: tuple[Any, ...]
    pre_pad: tuple[list[int], str] | None = None

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.pre_pad is not None:
            x = F.pad(x, self.pre_pad[0], mode=self.pre_pad[1])
        out: torch.Tensor = getattr(F, self.function)(x, weight, bias, *self.arguments)
        return out


class FusedConv(FusedLayer):
    """``steps(batch_norm(conv(x)))`` on ember's oneDNN convolution (csrc/onednn/), activations channels-last."""

    def __init__(self, state: LayerState, origin: str, geometry: Geometry, torch_call: ConvCall) -> None:
        super().__init__(state, origin)
        self.geometry = geometry
        self.torch_call = torch_call
        # The graph reads its residual operand nowhere after this call (accumulate_in_place.py): the fast call then
        # writes its output into the operand, where the kernel adds it in place.
        self.accumulates_into_operand = False

    def on_kernel(self, x: torch.Tensor, operand: torch.Tensor | None, tensors: Tensors) -> torch.Tensor | None:
        return conv.run(self.state, self.geometry, x, self.entries, operand, tensors)

    def fast_call(self, x: torch.Tensor, operand: torch.Tensor | None, out: torch.Tensor) -> FastConv | None:
        padded = self.geometry.pre_pad is not None
        return FastConv.of(x, operand, out, self.state, self.entries, padded, self.accumulates_into_operand)

    def layer_in_torch(self, x: torch.Tensor, tensors: Tensors) -> torch.Tensor:
        return self.torch_call(x, self.state.weight_of(tensors), tensors[1])
