"""Merged embedding bags that train themselves: the backward pass applies SGD or Adagrad to the rows the batch
touched, in the kernel that computes their gradients (csrc/embedding_bag). No gradient tensor exists, dense or
sparse, and the tables' weights never get a ``.grad``: leave them out of the optimizer that trains the rest of the
model (``model.parameters()`` minus these modules', or :func:`dense_parameters`).

The step is torch.optim's on a coalesced sparse gradient (ember/embedding_bag.h gives the formulas): with the same
hyper-parameters, a model trained this way follows ``nn.EmbeddingBag(sparse=True)`` + ``torch.optim.SGD`` or
``torch.optim.Adagrad`` to rounding. Weight decay, which torch's sparse paths refuse, applies to the touched rows.
Hyper-parameters are attributes (``module.lr = ...`` between steps, as a scheduler would), and
``optimizer_state_dict()`` / ``load_optimizer_state_dict()`` speak torch.optim's format: the state loads into
``torch.optim.SGD``/``Adagrad`` over the tables' weights, and back.

``split_bf16_()`` stores each table as split-BF16: the model computes with the bf16 top halves, and the update
joins them with their bottom halves, steps the exact float32 value and splits it again. ``state_dict()`` still gives
the float32 weights under the usual keys.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from typing import TypeGuard  # Python 3.10; annotations are not evaluated at run time

import torch
from torch import nn

from ember import _C, bf16
from ember._library import define
from ember._tensor import dlpack, sync_threads
from ember.bf16.checkpoints import install_checkpoint_hooks
from ember.nn.embedding_bag import MergedEmbeddingBag
from ember.nn.embedding_bag_args import normalize_call
from ember.nn.embedding_bag_ops import Tensors, given, kernel_inputs, num_bags, per_sample_backward, run_lookup

__all__ = ["MergedEmbeddingBagWithAdagrad", "MergedEmbeddingBagWithSGD", "dense_parameters"]

_LOOKUP = ("Tensor[] grads, Tensor[] indices, Tensor[] offsets, Tensor[] per_sample_weights, str mode, "
           "bool include_last_offset")  # fmt: skip


def _bottom_views(bottoms: list[torch.Tensor]) -> list[Any]:
    # A table that is not split has a 1-D empty placeholder (real bottoms are 2-D, like their weights).
    return [dlpack(b) if b.dim() == 2 else None for b in bottoms]


def _sgd_kernel(weights: Tensors, bottoms: Tensors, grads: Tensors, indices: Tensors, offsets: Tensors,
                per_sample_weights: Tensors, mode: str, include_last_offset: bool, lr: float,
                weight_decay: float) -> None:  # fmt: skip
    idx, off, psw = kernel_inputs(weights, indices, offsets, per_sample_weights)
    sync_threads()
    _C.merged_embedding_bag_sgd_update([dlpack(w) for w in weights], idx, off, psw,
                                       [dlpack(g.to(w.dtype).contiguous()) for g, w in zip(grads, weights)],
                                       _bottom_views(bottoms), mode=mode, include_last_offset=include_last_offset,
                                       lr=lr, weight_decay=weight_decay)  # fmt: skip


def _adagrad_kernel(weights: Tensors, bottoms: Tensors, state_sums: Tensors, steps: Tensors, grads: Tensors,
                    indices: Tensors, offsets: Tensors, per_sample_weights: Tensors, mode: str,
                    include_last_offset: bool, lr: float, lr_decay: float, weight_decay: float,
                    eps: float) -> None:  # fmt: skip
    idx, off, psw = kernel_inputs(weights, indices, offsets, per_sample_weights)
    sync_threads()
    _C.merged_embedding_bag_adagrad_update([dlpack(w) for w in weights], idx, off, psw,
                                           [dlpack(g.to(w.dtype).contiguous()) for g, w in zip(grads, weights)],
                                           _bottom_views(bottoms), [dlpack(s) for s in state_sums],
                                           [dlpack(s) for s in steps], mode=mode,
                                           include_last_offset=include_last_offset, lr=lr, lr_decay=lr_decay,
                                           weight_decay=weight_decay, eps=eps)  # fmt: skip


def _no_output(*args: Any) -> None:
    return None


_sgd_update: Callable[..., Any] = define(
    f"merged_embedding_bag_sgd_(Tensor(a!)[] weights, Tensor(b!)[] bottoms, {_LOOKUP}, float lr, "
    "float weight_decay) -> ()",
    _sgd_kernel,
    fake=_no_output,
)
_adagrad_update: Callable[..., Any] = define(
    f"merged_embedding_bag_adagrad_(Tensor(a!)[] weights, Tensor(b!)[] bottoms, Tensor(c!)[] state_sums, "
    f"Tensor(d!)[] steps, {_LOOKUP}, float lr, float lr_decay, float weight_decay, float eps) -> ()",
    _adagrad_kernel,
    fake=_no_output,
)


class _FusedLookup(torch.autograd.Function):
    """The pooled lookup whose backward is the module's optimizer step (and the per-sample weights' gradient)."""

    @staticmethod
    def forward(ctx: Any, module: _FusedBase, lookup: tuple[Any, ...], *params: torch.Tensor) -> Any:
        ctx.module, ctx.lookup = module, lookup
        indices, offsets, per_sample_weights, mode, include_last_offset = lookup
        psw = [p.detach() for p in per_sample_weights]
        weights = list(params[: len(module)])
        return tuple(run_lookup(weights, indices, offsets, psw, mode, include_last_offset, False))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> Any:
        module: _FusedBase = ctx.module
        indices, offsets, per_sample_weights, mode, include_last_offset = ctx.lookup
        weights = module._weights()
        grads_ = [torch.zeros(num_bags(o, include_last_offset), w.shape[1], dtype=w.dtype) if g is None else g
                  for g, o, w in zip(grads, offsets, weights)]  # fmt: skip
        args = (grads_, indices, offsets, [p.detach() for p in per_sample_weights], mode, include_last_offset)
        psw_grads: list[torch.Tensor | None] = [None] * len(module)
        if any(given(p) and p.requires_grad for p in per_sample_weights):
            # Before the step: the gradient of a per-sample weight is taken at the weights that were used.
            computed = per_sample_backward(grads_, weights, *args[1:])
            psw_grads = [g if given(p) else None for g, p in zip(computed, per_sample_weights)]
        with torch.no_grad():
            module._step(args)
        return (None, None, *([None] * len(module)), *psw_grads)


class _FusedBase(MergedEmbeddingBag):
    def _init_extra(self, **hyper: Any) -> None:
        for name, default in self._HYPER.items():
            value = float(hyper.pop(name, default))
            if not value >= 0.0 or value == float("inf"):
                raise ValueError(f"{type(self).__name__}: {name} must be a finite number >= 0, got {value}")
            setattr(self, name, value)
        if hyper:
            raise TypeError(f"{type(self).__name__}: unexpected arguments {sorted(hyper)}")
        self._bottoms: dict[torch.Tensor, torch.Tensor] = {}
        self._init_state()

    _HYPER: ClassVar[dict[str, float]] = {}

    def _init_state(self) -> None:
        pass

    def _step(self, args: tuple[Any, ...]) -> None:
        """The optimizer step over the rows a lookup touched (the subclass's optimizer)."""
        raise NotImplementedError

    def forward(
        self,
        indices: Sequence[torch.Tensor],
        offsets: Sequence[torch.Tensor] | None = None,
        per_sample_weights: Sequence[torch.Tensor | None] | None = None,
        lengths: Sequence[torch.Tensor] | None = None,
        out: Sequence[torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        weights = self._weights()
        if out is not None or not torch.is_grad_enabled() or not any(w.requires_grad for w in weights):
            # out= under grad mode with trainable weights raises there: pooling into given tensors has no backward.
            return super().forward(indices, offsets, per_sample_weights, lengths, out)
        if any(w.dtype == torch.float64 for w in weights):
            raise TypeError(f"{type(self).__name__}: the fused update takes float32 or bfloat16 tables, not float64 "
                            "(float64 tables train through MergedEmbeddingBag and a torch optimizer)")  # fmt: skip
        flat, starts, psw = normalize_call(weights, indices, offsets, per_sample_weights, lengths,
                                            self.include_last_offset)  # fmt: skip
        lookup = (flat, starts, psw, self.mode, self.include_last_offset)
        return list(_FusedLookup.apply(self, lookup, *weights, *psw))  # type: ignore[no-untyped-call]

    def _bottom_list(self) -> list[torch.Tensor]:
        return [self._bottoms.get(t.weight, t.weight.new_empty(0)) for t in self]

    def split_bf16_(self) -> _FusedBase:
        """Stores every float32 table as split-BF16 (bf16 weights the model computes with, int16 bottom halves the
        update joins them with); state_dict keeps giving float32 weights. Returns self."""
        for table in self:
            w = table.weight
            if w.dtype != torch.float32:
                continue
            top, bottom = bf16.split(w.detach())
            table.weight = nn.Parameter(top, requires_grad=w.requires_grad)
            self._bottoms[table.weight] = bottom
        install_checkpoint_hooks(self, self._bottoms)
        return self

    def _optimizer_over_shadows(self) -> tuple[torch.optim.Optimizer, list[torch.Tensor]]:
        """A torch optimizer of this module's kind and hyper-parameters over float32 stand-ins of the weights (the
        exported state refers to parameters by position only, and float32 stand-ins keep torch from casting the
        state to a bf16 weight's dtype)."""
        shadows = [torch.empty(t.weight.shape, dtype=torch.float32) for t in self]
        return self._make_optimizer(shadows), shadows

    def _make_optimizer(self, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        raise NotImplementedError

    def extra_repr(self) -> str:
        hyper = ", ".join(f"{name}={getattr(self, name):g}" for name in self._HYPER)
        return f"{super().extra_repr()}, {hyper}"


def _lookup_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: kwargs.pop(k) for k in ("mode", "include_last_offset", "dtype") if k in kwargs}


class MergedEmbeddingBagWithSGD(_FusedBase):
    """:class:`MergedEmbeddingBag` whose backward applies SGD (``lr``, ``weight_decay``) to the touched rows.

    ``MergedEmbeddingBagWithSGD.from_embeddingbag_list(tables, lr=0.1)`` adopts existing tables.
    """

    _HYPER: ClassVar[dict[str, float]] = {"lr": 0.01, "weight_decay": 0.0}
    lr: float
    weight_decay: float

    def __init__(self, num_embeddings: Sequence[int], embedding_dim: int | Sequence[int], **kwargs: Any) -> None:
        super().__init__(num_embeddings, embedding_dim, **_lookup_kwargs(kwargs))
        self._init_extra(**kwargs)

    def _step(self, args: tuple[Any, ...]) -> None:
        weights = [t.weight for t in self]
        _sgd_update(weights, self._bottom_list(), *args, self.lr, self.weight_decay)

    def _make_optimizer(self, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=self.lr, weight_decay=self.weight_decay)

    def optimizer_state_dict(self) -> dict[str, Any]:
        """torch.optim.SGD's state_dict for the tables' weights (SGD without momentum keeps no state)."""
        return self._optimizer_over_shadows()[0].state_dict()

    def load_optimizer_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Takes the hyper-parameters from a torch.optim.SGD state_dict over the tables' weights."""
        optimizer, _ = self._optimizer_over_shadows()
        optimizer.load_state_dict(state_dict)
        group = optimizer.param_groups[0]
        if group.get("momentum", 0) or group.get("nesterov", False):
            raise NotImplementedError("MergedEmbeddingBagWithSGD: momentum would touch every row each step")
        self.lr, self.weight_decay = float(group["lr"]), float(group["weight_decay"])


class MergedEmbeddingBagWithAdagrad(_FusedBase):
    """:class:`MergedEmbeddingBag` whose backward applies Adagrad (``lr``, ``lr_decay``, ``weight_decay``, ``eps``,
    ``initial_accumulator_value``) to the touched rows; each table keeps its float32 ``sum`` and its ``step``."""

    _HYPER: ClassVar[dict[str, float]] = {
        "lr": 0.01,
        "lr_decay": 0.0,
        "weight_decay": 0.0,
        "eps": 1e-10,
        "initial_accumulator_value": 0.0,
    }
    lr: float
    lr_decay: float
    weight_decay: float
    eps: float
    initial_accumulator_value: float
    state_sums: list[torch.Tensor]
    steps: list[torch.Tensor]

    def __init__(self, num_embeddings: Sequence[int], embedding_dim: int | Sequence[int], **kwargs: Any) -> None:
        super().__init__(num_embeddings, embedding_dim, **_lookup_kwargs(kwargs))
        self._init_extra(**kwargs)

    def _init_state(self) -> None:
        self.state_sums = [torch.full(t.weight.shape, self.initial_accumulator_value, dtype=torch.float32)
                           for t in self]  # fmt: skip
        self.steps = [torch.zeros(1, dtype=torch.float32) for _ in self]

    def _step(self, args: tuple[Any, ...]) -> None:
        weights = [t.weight for t in self]
        _adagrad_update(weights, self._bottom_list(), self.state_sums, self.steps, *args, self.lr, self.lr_decay,
                        self.weight_decay, self.eps)  # fmt: skip

    def _make_optimizer(self, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        return torch.optim.Adagrad(params, lr=self.lr, lr_decay=self.lr_decay, weight_decay=self.weight_decay,
                                   eps=self.eps, initial_accumulator_value=self.initial_accumulator_value)  # fmt: skip

    def optimizer_state_dict(self) -> dict[str, Any]:
        """torch.optim.Adagrad's state_dict for the tables' weights: each one's ``sum`` and ``step``."""
        optimizer, shadows = self._optimizer_over_shadows()
        for p, state_sum, step in zip(shadows, self.state_sums, self.steps):
            optimizer.state[p]["sum"] = state_sum.clone()
            optimizer.state[p]["step"] = step.reshape(()).clone()
        return optimizer.state_dict()

    def load_optimizer_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Takes hyper-parameters and each table's sum and step from a torch.optim.Adagrad state_dict."""
        optimizer, shadows = self._optimizer_over_shadows()
        optimizer.load_state_dict(state_dict)
        group = optimizer.param_groups[0]
        for name in self._HYPER:
            setattr(self, name, float(group[name]))
        for p, state_sum, step in zip(shadows, self.state_sums, self.steps):
            state = optimizer.state[p]
            state_sum.copy_(state["sum"])
            step.copy_(torch.as_tensor(state["step"], dtype=torch.float32).reshape(1))


def is_self_training(module: nn.Module) -> TypeGuard[_FusedBase]:
    """True for the merged embedding bags whose backward steps their own tables."""
    return isinstance(module, _FusedBase)


def dense_parameters(model: nn.Module) -> Iterator[nn.Parameter]:
    """The parameters of ``model`` that an ordinary optimizer should train: all but the tables of the fused
    merged embedding bags, which train themselves."""
    fused = {id(p) for m in model.modules() if isinstance(m, _FusedBase) for p in m.parameters()}
    return (p for p in model.parameters() if id(p) not in fused)
