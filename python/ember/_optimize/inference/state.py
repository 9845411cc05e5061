"""The per-layer state of an inference-optimized module: what it computes in, what is folded into it, and the
oneDNN layer built from its weights, which is a cache.

The module's parameters stay the source of truth, under their keys, with their shapes and dtypes: the cache is
rebuilt whenever one of the tensors it was built from is replaced or changed in place (the tensor's version
counter), so ``load_state_dict``, an optimizer step on a model put back in train mode, or a manual
``weight.mul_()`` under ``torch.no_grad()`` never leave a stale copy behind. A change made through ``.data``
(``weight.data.mul_()``) bypasses the version counter, as it bypasses autograd's checks: a packed copy does not
see it, while a layer reading its weight in place does. The cache is not pickled or deep-copied: a copy builds its
own on its first call.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar, cast

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ember._compat import is_compiling, untraced
from ember._optimize.inference.common import fold_batchnorm, fold_channel_scale, parameter

# What a layer computes in, by the dtype ember.optimize was given.
COMPUTE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _version(t: torch.Tensor) -> int:
    # An inference tensor (made under torch.inference_mode) has no version counter and cannot be changed in place
    # outside it. Asked first, not caught: torch raises for it, and a raised error costs ~30 us on every call of every
    # layer of a model built under inference mode.
    return -1 if t.is_inference() else t._version


def _marks(tensors: tuple[torch.Tensor | None, ...]) -> tuple[tuple[Any, int, int] | None, ...]:
    """What identifies the exact values of ``tensors``: each one (weakly referenced, so the cache never keeps a
    replaced parameter alive), its version counter, which every in-place change bumps (-1 for an inference tensor,
    which has none and stays one), and its data pointer, which ``param.data = other`` changes."""
    return tuple(None if t is None else (weakref.ref(t), _version(t), t.data_ptr()) for t in tensors)


def _unchanged(marks: tuple[tuple[Any, int, int] | None, ...], tensors: tuple[torch.Tensor | None, ...]) -> bool:
    # On every call of every layer: compares without building anything, asking each tensor as little as it can.
    if len(marks) != len(tensors):
        return False
    for mark, t in zip(marks, tensors):
        if mark is None or t is None:
            if mark is not None or t is not None:
                return False
            continue
        if mark[0]() is not t or mark[2] != t.data_ptr():
            return False
        if mark[1] >= 0 and mark[1] != t._version:  # (the same tensor: an inference tensor when it was one)
            return False
    return True


class CachedKernel:
    """What a layer derives from some tensors: a kernel object, built on demand, and call plans (what a call with a
    given input signature does, decided on its first call), all dropped together when any of the tensors changes.
    Safe to use from several threads: one builds, the others wait and use it.

    A layer's call takes the plan for its input's signature (:meth:`plan`, which tracks the layer's current
    tensors before it returns a plan for the kernel), then :attr:`kernel` or :meth:`build`:
    checks and decisions made once per input signature rather than on every call, which on a small layer cost
    more than the kernel. A plan that leaves the call to torch is followed without tracking: torch's path is
    right whatever the tensors are now, and a call that torch runs should cost what torch's does.
    """

    # Distinct input signatures (sequence lengths, batch sizes) a layer remembers; more start the memo afresh.
    MAX_PLANS = 256

    def __init__(self) -> None:
        self._kernel: Any = None
        self._marks: tuple[tuple[Any, int, int] | None, ...] = ()
        self.plans: dict[Any, Any] = {}
        # A graph node's call for inputs like its last (graph/fast_calls.py), made from the kernel: dropped with it;
        # and the pass of the graph's guard that last checked these tensors (-1: none; 0 means no pass).
        self.fast: Any = None
        self.checked = -1
        self._lock = threading.Lock()

    def track(self, tensors: tuple[torch.Tensor | None, ...]) -> bool:
        """Drops the kernel and the plans when any of ``tensors`` is not what they were made from; says whether it
        did."""
        if is_compiling():
            # torch.compile tracing a layer's call: dynamo cannot follow a comparison of data pointers (torch 2.8
            # to 2.11 fail with an internal error), and what the check decides is Python state, not graph: it runs
            # as Python, outside the trace.
            return bool(untraced(CachedKernel._track)(self, tensors))
        return self._track(tensors)

    def _track(self, tensors: tuple[torch.Tensor | None, ...]) -> bool:
        if _unchanged(self._marks, tensors):
            return False
        with self._lock:
            if not _unchanged(self._marks, tensors):
                self._kernel = None  # free the old copy before a new one is packed
                self.plans = {}
                self.fast = None
                self._marks = _marks(tensors)
        return True

    def plan(self, key: Any, tensors: tuple[torch.Tensor | None, ...], make: Callable[[], Any]) -> Any:
        """The plan for inputs of signature ``key``: the one kept, else ``make()``'s, kept. A kept plan that leaves
        calls to torch (``plan.torch``) is returned without tracking ``tensors``; any other is checked against
        them first (:meth:`track`), and made again when they changed."""
        plan = self.plans.get(key)
        if plan is not None and plan.torch:
            return plan
        if self.track(tensors) or plan is None:
            plan = self.add_plan(key, make())
        return plan

    def add_plan(self, key: Any, plan: Any) -> Any:
        """Remembers ``plan`` for inputs of signature ``key`` and returns it."""
        plans = self.plans
        if len(plans) >= self.MAX_PLANS:
            plans.clear()
        plans[key] = plan
        return plan

    def build(self, build: Callable[[], Any]) -> Any:
        """The kernel, built by ``build()`` unless another call built it since the last :meth:`track`."""
        with self._lock:
            if self._kernel is None:
                self._kernel = build()
            return self._kernel

    @property
    def marks(self) -> tuple[tuple[Any, int, int] | None, ...]:
        """What the kernel and plans were made from (:func:`_marks`), for a caller that compares in bulk."""
        return self._marks

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


def _current(marks: tuple[tuple[Any, int, int] | None, ...]) -> bool:
    """Whether ``marks`` (:func:`_marks`) still describe the tensors they were made from: all alive, at the same
    memory and version."""
    return _unchanged(marks, tuple(None if m is None else m[0]() for m in marks))


_K = TypeVar("_K")


class SharedKernels:
    """Kernels built the same way from the same tensors, one for every layer state that asks: graphs that
    torch.compile makes of one model (a new batch size re-traces the model, and the new graph's layers are new
    states) share their packed weights instead of packing a copy each. Looked up by the layer's first tensor, then
    by how the kernel is built (``config``) and the exact values of all its tensors (:func:`_marks`). Everything here
    is held weakly: the layer states that use a kernel keep it alive (a graph that goes frees the kernels no other
    graph reads), and a tensor that goes takes its entries with it. An entry built from values that changed since is
    dropped when its tensor's kernels are next looked up."""

    def __init__(self) -> None:
        # id(first tensor) -> {(config, identities): (marks, weak reference to the kernel)}; a finalizer on the
        # tensor drops its entry with it.
        self._by_tensor: dict[int, dict[Any, tuple[Any, weakref.ref[Any]]]] = {}
        self._lock = threading.Lock()

    def get(self, config: Any, tensors: tuple[torch.Tensor | None, ...], build: Callable[[], _K]) -> _K:
        """The kernel ``build()`` makes from ``tensors`` for ``config`` (hashable), built once while some layer
        holds it. Kernels must take weak references (pybind11's classes do)."""
        first = tensors[0]
        if first is None:
            return build()
        marks = _marks(tensors)
        key = (config, tuple(None if m is None else (id(m[0]()), m[1], m[2]) for m in marks))
        with self._lock:
            kernels = self._by_tensor.get(id(first))
            if kernels is not None:
                for gone in [k for k, (m, ref) in kernels.items() if ref() is None or not _current(m)]:
                    del kernels[gone]
                found = kernels.get(key)
                kernel = found[1]() if found is not None else None
                if kernel is not None:
                    return cast(_K, kernel)
        kernel = build()  # (outside the lock: packing a large weight must not stall other layers' lookups)
        with self._lock:
            kernels = self._by_tensor.get(id(first))
            if kernels is None:
                kernels = self._by_tensor[id(first)] = {}
                weakref.finalize(first, self._forget, id(first))
            found = kernels.get(key)
            other = found[1]() if found is not None else None
            if other is not None:  # (another thread built it meanwhile)
                return cast(_K, other)
            kernels[key] = (marks, weakref.ref(kernel))
            return kernel

    def _forget(self, tensor_id: int) -> None:
        # A tensor's finalizer: it may run inside get() on the same thread (a garbage collection while the lock is
        # held), so it takes no lock; a dict's pop is atomic, and the id is not reused before this has run.
        self._by_tensor.pop(tensor_id, None)

    def __len__(self) -> int:
        """How many kernels are alive here."""
        with self._lock:
            return sum(ref() is not None for kernels in self._by_tensor.values() for _, ref in kernels.values())


SHARED_KERNELS = SharedKernels()


class CallPlan:
    """What a layer's call does with inputs of one signature, decided on its first call: leave it to torch
    (:data:`TORCH_PLAN`), or run the kernel, converting the input to the compute dtype first or not, into an output
    of ``out_shape`` and ``out_strides``, passing the weight where it lies when ``in_place`` (Linear)."""

    __slots__ = ("convert", "in_place", "out_shape", "out_strides", "torch")

    def __init__(
        self,
        torch_: bool,
        convert: bool = False,
        out_shape: tuple[int, ...] = (),
        out_strides: tuple[int, ...] = (),
        in_place: bool = False,
    ) -> None:
        self.torch = torch_
        self.convert = convert
        self.out_shape = out_shape
        self.out_strides = out_strides
        self.in_place = in_place


TORCH_PLAN = CallPlan(True)


class TensorRef:
    """A tensor a kernel is built from, read where it lives on every call: ``owner.<name>``, a parameter or buffer
    of a module. Reading it anew each time is what lets a parameter replaced after optimizing (``load_state_dict``
    with ``assign=True``, ``module.weight = other``) be seen, as the module's own forward would see it."""

    __slots__ = ("name", "owner")

    def __init__(self, owner: nn.Module, name: str) -> None:
        self.owner = owner
        self.name = name

    def get(self) -> torch.Tensor | None:
        return parameter(self.owner, self.name)

    def __repr__(self) -> str:
        return f"TensorRef({type(self.owner).__name__}.{self.name})"


class FoldedBatchNorm:
    """A BatchNorm folded into the layer before it: where its statistics and affine tensors live, and its epsilon.
    Made from a module (:meth:`of_module`) or from the operands of a functional call in a graph."""

    __slots__ = ("bias", "eps", "name", "running_mean", "running_var", "weight")

    def __init__(
        self,
        running_mean: TensorRef,
        running_var: TensorRef,
        weight: TensorRef | None,
        bias: TensorRef | None,
        eps: float,
        name: str = "batch_norm",
    ) -> None:
        self.running_mean = running_mean
        self.running_var = running_var
        self.weight = weight
        self.bias = bias
        self.eps = eps
        self.name = name

    @staticmethod
    def of_module(bn: _BatchNorm) -> FoldedBatchNorm:
        return FoldedBatchNorm(
            TensorRef(bn, "running_mean"),
            TensorRef(bn, "running_var"),
            TensorRef(bn, "weight"),
            TensorRef(bn, "bias"),
            bn.eps,
            type(bn).__name__,
        )

    def tensors(self) -> tuple[torch.Tensor | None, ...]:
        """(weight, bias, running_mean, running_var) as they are now."""
        return (
            None if self.weight is None else self.weight.get(),
            None if self.bias is None else self.bias.get(),
            self.running_mean.get(),
            self.running_var.get(),
        )


class LayerState:
    """Held by each rewritten layer's forward (``module.forward.state``) and by each fused node of a graph.

    ``compute``: torch.float32 or torch.bfloat16. ``weight`` and ``bias``: where the layer's tensors live (a module's
    own, or the model's parameters a graph's functional call names); ``transposed``: the weight is held [in, out]
    (Hugging Face's Conv1D) and read as its transpose. ``bn``: a BatchNorm folded into this layer's output in the
    fast path (:meth:`fold`; it stays in the model under its own key, and runs itself whenever this layer did not
    fold it). ``scale``: a tensor of the model multiplying each output channel after that (:meth:`fold_scale`, graph
    mode's fold_scales: a layer scale, ConvNeXt's ``gamma * x``), folded into the weights too; the layer's result
    then has the dtype torch's product gives (an fp32 scale makes a bf16 layer's result fp32). ``pack``: give the
    layer a packed copy of its weights even where it could read them in place (the user's ``weights_prepack=True``:
    speed over memory).
    """

    def __init__(
        self,
        compute: torch.dtype,
        weight: TensorRef,
        bias: TensorRef | None,
        transposed: bool = False,
        pack: bool = False,
    ) -> None:
        self.compute = compute
        self.weight_ref = weight
        self.bias_ref = bias
        self.transposed = transposed
        self.bn: FoldedBatchNorm | None = None
        self.scale: TensorRef | None = None
        self.pack = pack
        self.cache = CachedKernel()

    @staticmethod
    def of_module(module: nn.Module, compute: torch.dtype, transposed: bool = False, pack: bool = False) -> LayerState:
        """The state of a layer whose weight and bias are ``module.weight`` and ``module.bias``."""
        return LayerState(compute, TensorRef(module, "weight"), TensorRef(module, "bias"), transposed, pack)

    def fold(self, bn: _BatchNorm | FoldedBatchNorm) -> None:
        """Folds ``bn`` into the layer's output from now on (its kernel is built again with the folded weights)."""
        self.bn = bn if isinstance(bn, FoldedBatchNorm) else FoldedBatchNorm.of_module(bn)

    def fold_scale(self, scale: TensorRef) -> None:
        """Folds a multiplication of the output (after any BatchNorm) by ``scale``, one factor per output channel,
        into the layer from now on."""
        self.scale = scale

    @property
    def folds(self) -> bool:
        """Whether the kernel's weights are new numbers (a BatchNorm or a scale folded in), not the layer's own."""
        return self.bn is not None or self.scale is not None

    def scale_of(self, tensors: tuple[torch.Tensor | None, ...]) -> torch.Tensor | None:
        """The folded scale from a tuple :meth:`tensors` gave (its last entry), or None."""
        return tensors[-1] if self.scale is not None else None

    def weight(self) -> torch.Tensor:
        """The weight as the kernel reads it ([out, in] for a matmul), where it lives now."""
        return self.weight_of((self.weight_ref.get(),))

    def weight_of(self, tensors: tuple[torch.Tensor | None, ...]) -> torch.Tensor:
        """The weight as the kernel reads it, from a tuple :meth:`tensors` gave (or a caller passed in its place);
        TypeError when it is not a tensor."""
        w = tensors[0]
        if not isinstance(w, torch.Tensor):
            ref = self.weight_ref
            raise TypeError(f"ember: {type(ref.owner).__name__}.{ref.name} is {type(w).__name__}, not a tensor")
        return w.t() if self.transposed else w

    def weight_like(self, tensors: tuple[torch.Tensor | None, ...]) -> torch.Tensor:
        """A tensor of the weight's shape and dtype as the kernel reads it, for the decisions that read no values (a
        call's plan, the router): here the weight itself."""
        return self.weight_of(tensors)

    def folded_weights(self, tensors: tuple[torch.Tensor | None, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The weight (as the kernel reads it) and bias of the layer with its BatchNorm folded in, from ``tensors``
        (:meth:`tensors`' order: weight, bias, then the BatchNorm's weight, bias, running mean and variance, then the
        scale)."""
        weight = self.weight_of(tensors).detach()
        bias = tensors[1].detach() if tensors[1] is not None else None
        if self.bn is not None:
            weight, bias = fold_batchnorm(weight, bias, tensors[2:6], self.bn.eps)
        scale = self.scale_of(tensors)
        if scale is not None:
            weight, bias = fold_channel_scale(weight, bias, scale.detach())
        return weight, bias

    def tensors(self) -> tuple[torch.Tensor | None, ...]:
        """The tensors the layer's kernel is built from: its weight and bias, and the folded BatchNorm's. (On every
        call of every layer: the registry is read inline.)"""
        w, b = self.weight_ref, self.bias_ref
        weight = parameter(w.owner, w.name)
        bias = None if b is None else parameter(b.owner, b.name)
        if self.bn is None and self.scale is None:
            return (weight, bias)
        norm = () if self.bn is None else self.bn.tensors()
        return (weight, bias, *norm) if self.scale is None else (weight, bias, *norm, self.scale.get())

    def refs(self) -> tuple[TensorRef | None, ...]:
        """Where each of :meth:`tensors` lives, in its order (None for a bias the layer does not have)."""
        bn = self.bn
        own = (self.weight_ref, self.bias_ref)
        norm = () if bn is None else (bn.weight, bn.bias, bn.running_mean, bn.running_var)
        return (*own, *norm) if self.scale is None else (*own, *norm, self.scale)

    def __repr__(self) -> str:
        folded = f", folds {self.bn.name}" if self.bn is not None else ""
        scaled = ", folds a scale" if self.scale is not None else ""
        return f"LayerState(compute={self.compute}{folded}{scaled})"


class MergedLayerState(LayerState):
    """The state of several Linears that read one input, run as one GEMM over their weights stacked along the
    outputs (graph mode's merge_linears: a transformer's Q, K and V projections). Each part keeps its own refs; the
    tensors are the parts' (weight, bias) pairs in order, and the kernel is built from their concatenation, always
    as a packed copy (no single tensor holds the stacked weight to be read in place)."""

    def __init__(self, parts: list[LayerState]) -> None:
        first = parts[0]
        super().__init__(first.compute, first.weight_ref, first.bias_ref, pack=True)
        self.parts = parts

    def weight(self) -> torch.Tensor:
        return self.weight_of(self.tensors())

    def weight_of(self, tensors: tuple[torch.Tensor | None, ...]) -> torch.Tensor:
        """The stacked weight ([sum of outputs, in]) from :meth:`tensors`' order."""
        return torch.cat([p.weight_of(tensors[2 * i : 2 * i + 2]) for i, p in enumerate(self.parts)], dim=0)

    def weight_like(self, tensors: tuple[torch.Tensor | None, ...]) -> torch.Tensor:
        """The stack's shape and dtype without stacking (a zero-stride view): a plan is made for each new input
        shape, and stacking a 7B model's Q, K and V weights there copied hundreds of megabytes a layer."""
        weights = [p.weight_of(tensors[2 * i : 2 * i + 2]) for i, p in enumerate(self.parts)]
        return weights[0].new_zeros(()).expand(sum(w.shape[0] for w in weights), weights[0].shape[1])

    def bias_of(self, tensors: tuple[torch.Tensor | None, ...]) -> torch.Tensor | None:
        """The stacked bias, zeros for a part without one; None when no part has one."""
        biases = tensors[1::2]
        if all(b is None for b in biases):
            return None
        pieces = []
        for i, b in enumerate(biases):
            if b is None:
                weight = self.parts[i].weight_of(tensors[2 * i : 2 * i + 2])
                b = torch.zeros(weight.shape[0], dtype=weight.dtype)
            pieces.append(b)
        return torch.cat(pieces)

    def folded_weights(self, tensors: tuple[torch.Tensor | None, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
        bias = self.bias_of(tensors)
        return self.weight_of(tensors).detach(), None if bias is None else bias.detach()

    def tensors(self) -> tuple[torch.Tensor | None, ...]:
        return tuple(t for part in self.parts for t in part.tensors())

    def refs(self) -> tuple[TensorRef | None, ...]:
        return tuple(r for part in self.parts for r in part.refs())

    def __repr__(self) -> str:
        return f"MergedLayerState(compute={self.compute}, parts={len(self.parts)})"
