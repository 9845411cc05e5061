"""The per-layer state of an inference-optimized module: what it computes in, what is folded into it, and the
oneDNN layer built from its weights, which is a cache.

The module's parameters stay the source of truth, under their keys, with their shapes and dtypes: the cache is
rebuilt whenever one of the tensors it was built from is replaced or changed in place (the tensor's version
counter), so ``load_state_dict``, an optimizer step on a model put back in train mode, or a manual
``weight.data.mul_()`` never leave a stale copy behind. The cache is not pickled or deep-copied: a copy builds
its own on its first call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

# What a layer computes in, by the dtype ember.optimize was given.
COMPUTE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


def _signature(tensors: tuple[torch.Tensor | None, ...]) -> tuple[Any, ...]:
    """Identifies the exact values of ``tensors``: a replaced tensor or an in-place change alters it."""
    out: list[Any] = []
    for t in tensors:
        if t is None:
            out.append(None)
            continue
        try:
            version = t._version
        except RuntimeError:  # an inference tensor (made under torch.inference_mode) has no version counter
            version = -1
        out.append((id(t), t.data_ptr(), version, tuple(t.shape), t.dtype))
    return tuple(out)


class CachedKernel:
    """A kernel object built from some tensors, rebuilt when any of them changes. Safe to call from several
    threads: one builds, the others wait and use it."""

    def __init__(self) -> None:
        self._kernel: Any = None
        self._signature: tuple[Any, ...] | None = None
        self._lock = threading.Lock()

    def get(self, tensors: tuple[torch.Tensor | None, ...], build: Callable[[], Any]) -> Any:
        signature = _signature(tensors)
        kernel = self._kernel
        if kernel is not None and self._signature == signature:
            return kernel
        with self._lock:
            if self._kernel is None or self._signature != signature:
                self._kernel = None  # free the old copy before packing the new one
                self._kernel = build()
                self._signature = signature
            return self._kernel

    @property
    def kernel(self) -> Any:
        """The kernel built last, or None."""
        return self._kernel

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]

    def __deepcopy__(self, memo: dict[int, Any]) -> CachedKernel:
        return CachedKernel()


class LayerState:
    """Held by each rewritten layer's installed forward (``module.forward.state``).

    ``compute``: torch.float32 or torch.bfloat16. ``bn``: a BatchNorm module folded into this layer's output in
    the fast path (it stays in the model under its own key, and runs itself whenever this layer did not fold it).
    ``pack``: give the layer a packed copy of its weights even where it could read them in place (the user's
    ``weights_prepack=True``: speed over memory).
    """

    def __init__(self, compute: torch.dtype, bn: nn.Module | None = None, pack: bool = False) -> None:
        self.compute = compute
        self.bn = bn
        self.pack = pack
        self.cache = CachedKernel()

    def __repr__(self) -> str:
        folded = f", folds {type(self.bn).__name__}" if self.bn is not None else ""
        return f"LayerState(compute={self.compute}{folded})"
