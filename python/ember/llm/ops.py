"""The decoder's kernel calls, made two ways from one description of a layer (decoder.py): :class:`Calls` runs each
call at once (a forward of any shape), :class:`Recording` runs it and also appends it to an ``ember._C.Replay``, so
that the decode step of a batch size, recorded once, runs again in one C++ call with no Python between its kernels
(decode_replay.py). At batch 1 a token's ~180 kernel calls each cost a few microseconds of interpreter time around
kernels of 20-200: a tenth of the token, which the replay gives back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from ember import _C
from ember._tensor import dlpack
from ember.llm import kernels
from ember.llm.cache import KVCacheBase


class Mixture(Protocol):
    """A mixture of experts' MLP (moe.MoE): residual + its output for the rows x."""

    def forward(self, calls: Calls, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor: ...


class NotRecordable(Exception):
    """A call a replay cannot hold (torch's own matmul where the router picks it, padding, a prompt's attention):
    the step it belongs to runs call by call."""


class Calls:
    """Each call at once, on freshly allocated outputs: one ember kernel each (csrc/), on torch tensors."""

    def empty(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(*shape, dtype=dtype)

    def linear(
        self,
        lin: kernels.InPlaceLinear,
        x: torch.Tensor,
        epilogue: Sequence[str] = (),
        operand: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if lin.runs_in_torch(x.shape[0]):
            result = lin.torch_forward(x, epilogue, operand)
            if out is not None:
                out.copy_(result)
                return out
            return result
        if out is None:
            out = self.empty((x.shape[0], lin.out_features), x.dtype)
        lin.forward_into(x, out, epilogue, operand)
        return out

    def norm(
        self,
        x: torch.Tensor,
        norm: kernels.Norm,
        out: torch.Tensor | None = None,
        residual: torch.Tensor | None = None,
        sum_out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """norm(x [+ residual]); the sum into ``sum_out`` where a residual is given."""
        if out is None:
            out = self.empty(x.shape, x.dtype)
        _C.row_norm(norm.kind, dlpack(x), _optional(residual), dlpack(norm.weight), _optional(norm.bias), norm.eps,
                    dlpack(out), _optional(sum_out))  # fmt: skip
        return out

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor) -> None:
        _C.rotary_embedding(dlpack(x), dlpack(cos), dlpack(sin), dlpack(out))

    def kv_write(
        self, cache: KVCacheBase, layer: int, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None
    ) -> None:
        cache.paged.write(layer, dlpack(k), dlpack(v), _optional(keep))

    def attend_cache(
        self,
        q: torch.Tensor,
        cache: KVCacheBase,
        layer: int,
        key_limits: torch.Tensor | None,
        window: int,
        scale: float,
        out: torch.Tensor,
        softcap: float = 0.0,
    ) -> None:
        _C.attention_over_cache(dlpack(q), cache.paged, layer, _optional(key_limits), window, scale, dlpack(out),
                                softcap)  # fmt: skip

    def mixture(self, mixture: Mixture, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + a mixture of experts' output for the rows x (routed by their values: not recordable)."""
        return mixture.forward(self, x, residual)

    def copy(self, src: torch.Tensor, out: torch.Tensor) -> None:
        """out = src, element for element (src's sizes; out dense)."""
        out.copy_(src)

    def attend_prompt(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        causal: bool,
        scale: float,
        out: torch.Tensor,
        softcap: float = 0.0,
    ) -> None:
        _C.scaled_dot_product_attention(dlpack(q), dlpack(k), dlpack(v), _optional(mask), causal, scale, dlpack(out),
                                        softcap)  # fmt: skip


class Recording(Calls):
    """Each call at once, and appended to a replay whose operands are views into slots: the call's tensors (bound by
    :meth:`bind`, given anew to each run), and everything else the calls touch (weights, the intermediate buffers
    this recording allocates) bound for the replay's life."""

    def __init__(self, call_tensors: Sequence[torch.Tensor]) -> None:
        self.replay = _C.Replay(len(call_tensors))
        # (first byte, past the last byte, slot) of each tensor bound to a slot; a view is found inside one
        self._ranges: list[tuple[int, int, int]] = []
        for i, t in enumerate(call_tensors):
            self._ranges.append((t.data_ptr(), t.data_ptr() + _extent(t), i))

    def empty(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """A buffer of the replay's own, bound to a slot for its life (the step's intermediate values)."""
        t = super().empty(shape, dtype)
        self._bind(t)
        return t

    def _bind(self, t: torch.Tensor) -> int:
        slot = self.replay.constant(dlpack(t))
        self._ranges.append((t.data_ptr(), t.data_ptr() + _extent(t), slot))
        return int(slot)

    def _ref(self, t: torch.Tensor) -> tuple[int, int, Any]:
        """``t`` as the replay names an operand: (slot, byte offset, a tensor of its sizes, strides and dtype). A
        tensor in none of the slots (a weight, a norm's parameters) is bound to one of its own."""
        start, end = t.data_ptr(), t.data_ptr() + _extent(t)
        for first, last, slot in self._ranges:
            if first <= start and end <= last:
                return (slot, start - first, dlpack(t))
        return (self._bind(t), 0, dlpack(t))

    def linear(
        self,
        lin: kernels.InPlaceLinear,
        x: torch.Tensor,
        epilogue: Sequence[str] = (),
        operand: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if lin.runs_in_torch(x.shape[0]):
            raise NotRecordable("torch's matmul serves this layer")
        out = super().linear(lin, x, epilogue, operand, out)
        weight = self._ref(lin.weight) if lin.in_place else None
        self.replay.linear(lin.kernel, self._ref(x), weight, self._ref(out), list(epilogue),
                           None if operand is None else self._ref(operand))  # fmt: skip
        return out

    def norm(
        self,
        x: torch.Tensor,
        norm: kernels.Norm,
        out: torch.Tensor | None = None,
        residual: torch.Tensor | None = None,
        sum_out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        out = super().norm(x, norm, out, residual, sum_out)
        self.replay.row_norm(norm.kind, self._ref(x), self._optional_ref(residual), self._ref(norm.weight),
                             self._optional_ref(norm.bias), norm.eps, self._ref(out), self._optional_ref(sum_out),
                             None)  # fmt: skip
        return out

    def _optional_ref(self, t: torch.Tensor | None) -> tuple[int, int, Any] | None:
        return None if t is None else self._ref(t)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor) -> None:
        super().rope(x, cos, sin, out)
        self.replay.rotary_embedding(self._ref(x), self._ref(cos), self._ref(sin), self._ref(out))

    def kv_write(
        self, cache: KVCacheBase, layer: int, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None
    ) -> None:
        if keep is not None:
            raise NotRecordable("padding")
        super().kv_write(cache, layer, k, v, keep)
        self.replay.kv_write(layer, self._ref(k), self._ref(v))

    def attend_cache(
        self,
        q: torch.Tensor,
        cache: KVCacheBase,
        layer: int,
        key_limits: torch.Tensor | None,
        window: int,
        scale: float,
        out: torch.Tensor,
        softcap: float = 0.0,
    ) -> None:
        if key_limits is not None:
            raise NotRecordable("key limits")
        super().attend_cache(q, cache, layer, key_limits, window, scale, out, softcap)
        self.replay.attention_over_cache(self._ref(q), layer, window, scale, self._ref(out), softcap)

    def attend_prompt(self, *args: Any, **kwargs: Any) -> None:
        raise NotRecordable("a prompt's attention")

    def copy(self, src: torch.Tensor, out: torch.Tensor) -> None:
        super().copy(src, out)
        self.replay.copy(self._ref(src), self._ref(out))

    def mixture(self, mixture: Mixture, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        raise NotRecordable("a mixture of experts routes each step by its values")


def _optional(t: torch.Tensor | None) -> Any:
    return None if t is None else dlpack(t)


def _extent(t: torch.Tensor) -> int:
    """Bytes from ``t``'s first element past its last (strides >= 0)."""
    if t.numel() == 0:
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * t.element_size()
