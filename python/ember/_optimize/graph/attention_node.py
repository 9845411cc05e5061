"""The module graph mode puts in place of an attention: ``softmax(scale * q @ k^T + mask) @ v`` on ember's
flash-attention kernel (csrc/attention/), whether the graph spelled it as ``F.scaled_dot_product_attention`` or wrote
the matmul - scale - mask - softmax - matmul out.

The node keeps the graph's own operations it replaced, as a small GraphModule of ``(q, k, v, mask)`` (``original``),
and runs them whenever the kernel does not take a call: autograd, a dtype or shape it does not run (fp16, fp64,
batch dimensions that broadcast), a mask of another kind. The result's dtype is the one those operations give for
the call's dtypes under the autocast state of the call (found by running them once on one query and one key, and
remembered per combination of dtypes); the kernel computes in it.

What the kernel computes differently, by design: the scores, the softmax and the sums stay float32 in a bf16 call
(a written-out bf16 chain rounds the scores and the probabilities to bf16 on the way), and a query row whose every
key is masked (-inf or False) gets zeros where a written-out softmax gives NaN (torch's own fused kernels give
zeros too).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import fx, nn

from ember import _C
from ember._optimize.graph.fast_calls import RECORDING
from ember._optimize.graph.known_masks import KnownMask, recognize
from ember._optimize.graph.probe import KERNEL_DTYPES, one_element, result_dtype
from ember._optimize.inference.common import cpu_autocast_dtype, tensors_allow_fast_path
from ember._tensor import dlpack, sync_threads

# The dtypes of one call, which decide the dtype of the result: q, k, v, the mask and autocast's dtype.
_DtypeKey = tuple[Any, ...]


class FusedAttention(nn.Module):
    """``softmax(scale * q @ k^T + mask) @ v`` over ``[batch, heads, length, features]`` operands (or ``[batch *
    heads, length, features]``).

    - ``scale``: the factor of the scores; None for ``1 / sqrt(features)`` (SDPA's default).
    - ``causal``: keys after each query masked (SDPA's ``is_causal``, the top-left triangle).
    - ``bool_mask_keeps``: a bool mask keeps the scores where True (SDPA's meaning); where False, the graph added
      the mask to the scores as numbers, and a bool mask there is left to torch.
    - ``grouped``: fewer key/value heads than query heads are shared among them (SDPA's ``enable_gqa``).
    - ``keys_transposed``: the call passes ``k^T`` (``[..., features, keys]``), the graph's own transpose of k being
      read elsewhere too.
    - ``repeats_heads``: the call passes k and v before the graph repeated each head to the query heads (Hugging
      Face's repeat_kv): the kernel reads them as groups, the graph's own operations get them repeated.
    - ``mask_fill``: the mask is a bool condition where the graph filled the scores with this value (at most
      -1e30, DeBERTa's ``finfo.min``): the kernel adds the value where the condition holds, which gives the same
      probabilities, a row filled throughout weighing every key alike.
    - ``heads``: the operands are ``[batch * heads, length, features]`` and the graph viewed the scores as
      ``[batch, heads, ...]`` for the mask (DeBERTa's ``bmm``): the kernel reads them so and returns the result as
      ``[batch * heads, queries, features]``.
    - ``query_scale``: the graph multiplied the queries by this number before the attention (torchvision's Swin,
      ``q * head_dim ** -0.5``): the call passes them unscaled and the kernel takes the factor into its scale (the
      product rounded once, in fp32, where the graph rounded the scaled queries to their dtype first); the graph's
      own operations get them scaled.
    """

    def __init__(
        self,
        original: fx.GraphModule,
        scale: float | None,
        causal: bool,
        bool_mask_keeps: bool,
        grouped: bool,
        keys_transposed: bool,
        origin: str,
        repeats_heads: bool = False,
        mask_fill: float | None = None,
        heads: int | None = None,
    ) -> None:
        super().__init__()
        self.original = original  # (q, k, v, mask) -> result
        self.scale = scale
        self.causal = causal
        self.bool_mask_keeps = bool_mask_keeps
        self.grouped = grouped
        self.keys_transposed = keys_transposed
        self.repeats_heads = repeats_heads
        self.mask_fill = mask_fill
        self.heads = heads
        self.query_scale: float | None = None  # (set by fuse_attention where it takes the graph's scaling of q in)
        self.origin = origin
        self._plans: dict[_DtypeKey, torch.dtype | None] = {}

    def forward(self, q: Any, k: Any, v: Any, mask: Any = None) -> Any:
        plain = all(isinstance(t, torch.Tensor) for t in (q, k, v)) and (mask is None or isinstance(mask, torch.Tensor))
        if plain and tensors_allow_fast_path((k, v, mask), q):
            out = self._on_kernel(q, k, v, mask)
            if out is not None:
                return out
        return self._in_torch(q, k, v, mask)

    def _in_torch(self, q: Any, k: Any, v: Any, mask: Any) -> Any:
        """The graph's own operations (after the head repeat the graph made, where the node took it over)."""
        if self.repeats_heads:
            repeats = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
        if self.query_scale is not None:
            q = q * self.query_scale
        return self.original(q, k, v, mask)

    def _on_kernel(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> Any:
        given_mask = mask
        key = (q.dtype, k.dtype, v.dtype, None if mask is None else mask.dtype, cpu_autocast_dtype())
        if key in self._plans:
            dtype = self._plans[key]
        else:
            dtype = self._plans[key] = self._plan(q, k, v, mask)
        if dtype is None or not (q.is_cpu and k.is_cpu and v.is_cpu and (mask is None or mask.is_cpu)):
            return None
        if self.keys_transposed:
            k = k.transpose(-1, -2)
        dims = q.dim()
        if dims not in (3, 4) or k.dim() != dims or v.dim() != dims:
            return None
        split_heads = self.heads if dims == 3 else None
        split = split_heads is not None
        if split_heads is not None:  # [batch * heads, length, features], the graph's mask over [batch, heads, ...]
            heads = split_heads
            if q.shape[0] % heads or k.shape[0] != q.shape[0] or v.shape[0] != q.shape[0]:
                return None
            batch = q.shape[0] // heads
            q = q.reshape(batch, heads, q.shape[1], q.shape[2])
            k = k.reshape(batch, heads, k.shape[1], k.shape[2])
            v = v.reshape(batch, heads, v.shape[1], v.shape[2])
        elif dims == 3:  # [batch * heads, length, features]: one batch of that many heads
            q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
            if mask is not None and mask.dim() == 3:
                mask = mask.unsqueeze(0)
        if mask is not None and self.mask_fill is not None:
            if mask.dtype != torch.bool or not _broadcasts_to(mask, (q.shape[0], q.shape[1], q.shape[2], k.shape[2])):
                return None
            # Nothing filled (a batch without padding): no mask to read; else the fill as numbers to add.
            filled = bool(mask.any())
            mask = torch.zeros(mask.shape, dtype=torch.float32).masked_fill_(mask, self.mask_fill) if filled else None
        batch, heads, queries, features = q.shape
        _, heads_kv, keys, _ = k.shape
        if k.shape[0] != batch or k.shape[3] != features or v.shape[:3] != k.shape[:3] or features == 0:
            return None
        if heads != heads_kv and not (self.grouped and heads_kv > 0 and heads % heads_kv == 0):
            return None
        if mask is not None and not self._takes_mask(mask, (batch, heads, queries, keys)):
            return None
        causal = self.causal
        if mask is not None:
            known = recognize(mask, self.bool_mask_keeps)
            if known is KnownMask.NOTHING:  # an encoder's mask with no padding to tell: the kernel reads none
                mask = None
            elif known is KnownMask.CAUSAL and not causal:
                mask, causal = None, True  # a decoder's written-out triangle: the kernel skips the keys it masks
        # (Written out, not as generators: this runs on every call of every attention, where they cost microseconds.)
        if q.dtype != dtype:  # autocast's conversions
            q = q.to(dtype)
        if k.dtype != dtype:
            k = k.to(dtype)
        if v.dtype != dtype:
            v = v.to(dtype)
        if q.stride(3) != 1 and features > 1:
            q = q.contiguous()
        if k.stride(3) != 1 and features > 1:
            k = k.contiguous()
        if v.stride(3) != 1 and v.shape[3] > 1:
            v = v.contiguous()
        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(features)
        if self.query_scale is not None:
            scale *= self.query_scale
        if split:  # dense as [batch * heads, ...], the form the graph reads
            out = torch.empty((batch, heads, queries, v.shape[3]), dtype=dtype)
        elif dims == 3:
            out = torch.empty((1, heads, queries, v.shape[3]), dtype=dtype)
        else:  # the layout torch's own kernel returns, which the usual transpose back to [b, l, h, e] makes dense
            width = v.shape[3]
            out = torch.empty_strided(
                (batch, heads, queries, width), (queries * heads * width, width, heads * width, 1), dtype=dtype
            )
        sync_threads()
        _C.scaled_dot_product_attention(
            dlpack(q), dlpack(k), dlpack(v), None if mask is None else dlpack(mask), causal, scale, dlpack(out)
        )
        recorder = RECORDING.active
        if recorder is not None:
            reading = "fills" if self.mask_fill is not None else self.bool_mask_keeps
            recorder.attention(q, k, v, mask, causal, scale, out, given_mask, reading)
        if split:
            return out.flatten(0, 1)
        return out[0] if dims == 3 else out

    def _takes_mask(self, mask: torch.Tensor, shape: tuple[int, int, int, int]) -> bool:
        if mask.dtype == torch.bool:
            if not self.bool_mask_keeps:
                return False
        elif mask.dtype not in KERNEL_DTYPES:
            return False
        return _broadcasts_to(mask, shape)

    def _plan(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.dtype | None:
        """The kernel's dtype for operands of these dtypes (under the autocast now): the result's, where it runs it
        and the operands are of kernel dtypes; else None."""
        if any(t.dtype not in KERNEL_DTYPES for t in (q, k, v)):
            return None
        k_features = k.dim() - 2 if self.keys_transposed else k.dim() - 1
        cut = [one_element(q, q.dim() - 1), one_element(k, k_features), one_element(v, v.dim() - 1)]
        if self.heads is not None and q.dim() == 3:  # the graph views the scores as [batch, heads, ...]: one batch
            heads = self.heads
            cut = [t.expand(heads, -1, -1) for t in cut if t is not None]
        return result_dtype(self._in_torch, *cut, one_element(mask))

    def extra_repr(self) -> str:
        scale = "1/sqrt(features)" if self.scale is None else f"{self.scale:g}"
        traits = [f"scale {scale}"]
        if self.causal:
            traits.append("causal")
        if self.grouped:
            traits.append("grouped key/value heads")
        if self.mask_fill is not None:
            traits.append(f"mask filling {self.mask_fill:g}")
        if self.heads is not None:
            traits.append(f"{self.heads} heads split from the batch")
        if self.query_scale is not None:
            traits.append(f"queries scaled by {self.query_scale:g}")
        return f"{self.origin}: {', '.join(traits)}"


def _broadcasts_to(mask: torch.Tensor, shape: tuple[int, int, int, int]) -> bool:
    """Whether ``mask`` broadcasts to the scores' ``[batch, heads, queries, keys]`` (at most 4-D, at least 1-D)."""
    dims = mask.dim()
    if dims > 4 or dims == 0:
        return False
    sizes = mask.shape
    for d in range(dims):
        size = sizes[d]
        if size != 1 and size != shape[4 - dims + d]:
            return False
    return True
