"""What a fused step hands its kernel, and how little Python that costs per tensor.

A ResNet-50 step updates 161 parameters, each with a gradient and two to four state tensors; on the Xeon the kernel
spends about 32 us per parameter on average (5.1 ms for all 161), so every microsecond of Python per parameter
costs about 3% of the step. Two things keep it small:

- :class:`StepPlan` holds the DLPack capsules of a group's parameters, state tensors and split-BF16 bottom halves
  from one step to the next. A capsule is only borrowed by the kernel, so it can be reused as long as every tensor
  still is the object it was and still points at the same memory (``p.data = ...`` and ``set_`` move a tensor to
  other memory without changing its identity, and a stale pointer would be a write into freed memory). Each step
  checks exactly that, column by column, with C-level ``map``s: no Python bytecode runs per tensor.
- :func:`gradients` and :func:`grad_capsules` read and wrap the gradients (new tensors every step under
  ``zero_grad(set_to_none=True)``) the same way.

Everything about a tensor beyond identity and address (dtype, shape, layout, aliasing, device) is checked by the
kernel's own entry point, on every call, before it writes anything.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Any

import torch

from ember._tensor import dlpack

_is_none = functools.partial(operator.is_, None)
_is_tensor = functools.partial(operator.is_not, None)
_grad = operator.attrgetter("grad")
_is_sparse = operator.attrgetter("is_sparse")
_data_ptr = torch.Tensor.data_ptr
_is_contiguous = torch.Tensor.is_contiguous

State = MutableMapping[str, Any]


def _no_keys(state: State) -> tuple[()]:
    return ()


class StepPlan:
    """The capsules of one param group's step: ``params``, ``state[key]`` per key, and the bottom halves.

    Built by :meth:`build`, which creates missing state through the optimizer's ``init_state``; reused while
    :meth:`matches` holds. Used as a context manager around the kernel call: state created by a build is pending
    until that call succeeds; if it raises, every state dict the build touched is put back as it was (so a refused
    step leaves the optimizer exactly as it was) and the plan is never used again.
    """

    __slots__ = (
        "_all_state",
        "_broken",
        "_getter",
        "_pending",
        "_pointers",
        "_state_values",
        "bottom_capsules",
        "bottoms",
        "keys",
        "param_capsules",
        "params",
        "state_capsules",
        "state_columns",
    )

    def __init__(
        self,
        params: list[torch.Tensor],
        keys: tuple[str, ...],
        states: list[State],
        bottoms: list[torch.Tensor | None],
    ) -> None:
        self.params = params
        self.keys = keys
        self.state_columns = [[state[key] for state in states] for key in keys]
        # Bottoms are passed only when some parameter is split (the kernels take an empty list as "none is").
        self.bottoms = bottoms if any(map(_is_tensor, bottoms)) else []
        self.param_capsules = list(map(dlpack, params))
        self.state_capsules = [list(map(dlpack, column)) for column in self.state_columns]
        self.bottom_capsules = [None if b is None else dlpack(b) for b in self.bottoms]
        self._getter: Callable[[State], Any] = operator.itemgetter(*keys) if keys else _no_keys
        self._state_values = self._values_of(states)
        self._pointers = self._current_pointers(params, self._state_values, self.bottoms)
        self._pending: list[dict[str, Any] | None] | None = None
        self._all_state: MutableMapping[torch.Tensor, State] | None = None
        self._broken = False

    @classmethod
    def build(
        cls,
        params: list[torch.Tensor],
        keys: tuple[str, ...],
        all_state: MutableMapping[torch.Tensor, State],
        bottoms: Mapping[torch.Tensor, torch.Tensor],
        init_state: Callable[[torch.Tensor, State], None],
    ) -> StepPlan:
        """A new plan, after ``init_state(p, state)`` has created whatever entries of ``keys`` are missing.

        A parameter whose state stays empty gets no entry in ``all_state`` (torch.optim.SGD without momentum
        keeps none)."""
        before: list[dict[str, Any] | None] = []
        states = []
        for p in params:
            existed = p in all_state
            state = all_state[p] if existed else {}
            before.append(dict(state) if existed else None)
            init_state(p, state)
            if "step" in keys:
                _step_as_tensor(state)
            if state and not existed:
                all_state[p] = state
            states.append(state)
        plan = cls(params, keys, states, [bottoms.get(p) for p in params])
        plan._pending, plan._all_state = before, all_state
        return plan

    def matches(
        self,
        params: list[torch.Tensor],
        keys: tuple[str, ...],
        all_state: MutableMapping[torch.Tensor, State],
        bottoms: Mapping[torch.Tensor, torch.Tensor],
    ) -> bool:
        """Whether this plan's capsules still are exactly the tensors a step over ``params`` must pass."""
        if (
            self._broken
            or keys != self.keys
            or len(params) != len(self.params)
            or not all(map(operator.is_, params, self.params))
        ):
            return False
        if keys:
            try:
                values = self._values_of(list(map(all_state.__getitem__, params)))
            except KeyError:  # an entry taken out of a state dict since the plan was built
                return False
            if not all(map(operator.is_, values, self._state_values)):
                return False
        if bottoms or self.bottoms:
            current_bottoms = list(map(bottoms.get, params))
            if self.bottoms:
                if not all(map(operator.is_, current_bottoms, self.bottoms)):
                    return False
            elif any(map(_is_tensor, current_bottoms)):
                return False
        return self._current_pointers(params, self._state_values, self.bottoms) == self._pointers

    def fresh(self, key: str) -> list[bool]:
        """Per parameter, whether ``state[key]`` was created for this step (SGD's first-step momentum)."""
        if self._pending is None:
            return [False] * len(self.params)
        column = self.state_columns[self.keys.index(key)]
        return [before is None or before.get(key) is not value for before, value in zip(self._pending, column)]

    def __enter__(self) -> StepPlan:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc_type is not None:
            self._broken = True
            self._undo()
        self._pending = self._all_state = None

    def _undo(self) -> None:
        """Puts every state dict that :meth:`build` touched back as it was."""
        if self._pending is None or self._all_state is None:
            return
        for p, before in zip(self.params, self._pending):
            if before is None:
                self._all_state.pop(p, None)
            else:
                state = self._all_state[p]
                state.clear()
                state.update(before)

    def _values_of(self, states: list[State]) -> list[Any]:
        """The state entries of ``keys``, parameter by parameter (one C-level pass)."""
        if not self.keys:
            return []
        if len(self.keys) == 1:
            return list(map(self._getter, states))
        return list(itertools.chain.from_iterable(map(self._getter, states)))

    @staticmethod
    def _current_pointers(
        params: list[torch.Tensor], state_values: list[torch.Tensor], bottoms: list[torch.Tensor | None]
    ) -> list[int]:
        present: Iterable[torch.Tensor] = filter(_is_tensor, bottoms)  # type: ignore[arg-type]  # Nones dropped
        return list(map(_data_ptr, itertools.chain(params, state_values, present)))


def params_with_grad(group_params: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The parameters that have a gradient, and their gradients (each read once)."""
    grads = list(map(_grad, group_params))
    if not any(map(_is_none, grads)):
        return list(group_params), grads
    kept = [(p, g) for p, g in zip(group_params, grads) if g is not None]
    return [p for p, _ in kept], [g for _, g in kept]


def any_sparse(grads: list[torch.Tensor]) -> bool:
    return any(map(_is_sparse, grads))


def grad_capsules(params: list[torch.Tensor], grads: list[torch.Tensor]) -> list[Any]:
    """Capsules of the gradients, each in its parameter's memory layout: the kernels walk a parameter, its gradient
    and its state as one flat array, so a gradient with other strides (a channels-last parameter with a contiguous
    gradient, say) is copied first. Contiguous pairs, the usual case, are recognised with two C-level maps."""
    if not (all(map(_is_contiguous, grads)) and all(map(_is_contiguous, params))):
        grads = [_in_layout_of(p, g) for p, g in zip(params, grads)]
    return list(map(dlpack, grads))


def _in_layout_of(p: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    if grad.stride() == p.stride() or grad.shape != p.shape:
        return grad  # (a gradient of another shape is refused by the kernel, by name)
    return torch.empty_like(p, memory_format=torch.preserve_format).copy_(grad)


def _step_as_tensor(state: State) -> None:
    """state['step'] as the float32 one-element tensor the kernels count in (older checkpoints hold a number)."""
    step = state["step"]
    # (A step on another device is refused by the kernel's own check, by name.)
    if not isinstance(step, torch.Tensor) or step.dtype is not torch.float32:
        state["step"] = torch.tensor(float(step), dtype=torch.float32)
