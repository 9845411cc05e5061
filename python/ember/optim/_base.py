"""What every ember optimizer shares: torch.optim compatibility of groups and state, the fused step, AMP scalars.
The hyper-parameters' defaults and checks are in ``_hyperparameters``, the state's creation in ``_state``.

An ember optimizer is a ``torch.optim.Optimizer``: param groups, ``add_param_group``, ``state_dict`` /
``load_state_dict``, hooks, LR schedulers and ``zero_grad`` are torch's own. What it changes is ``step``: every
parameter of a group is updated by one fused C++ call (one parallel pass over memory) instead of one torch op per
formula term per tensor. Its param groups carry exactly the keys that the running torch's optimizer of the same
name has, with the same defaults, so checkpoints move between the two in both directions.

Parameters may be float32, bfloat16 (fp32 state, one rounding per step) or split-BF16: an fp32 master weight
stored as its bf16 top half (the parameter the model computes with) and an int16 bottom half that the optimizer
holds beside its state (:meth:`FusedOptimizer.split_master_weights`). The bottom halves are weight data, not
optimizer state: ``state_dict()`` stays exactly torch.optim's, and the fp32 weights are read with
:meth:`FusedOptimizer.master_weight`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any

import torch

from ember._compat import mark_optimizer_stepped, optimizer_step_hooks, profiler_enabled
from ember._tensor import dlpack, sync_threads
from ember.bf16.master_weights import join_parameter, master_value, set_master_value, split_parameter
from ember.optim._hyperparameters import torch_group_defaults
from ember.optim._plan import StepPlan, any_sparse, params_with_grad


class FusedOptimizer(torch.optim.Optimizer):
    """Base of ember's optimizers; subclasses set ``_torch_class`` and implement ``_step_group``."""

    _torch_class: type | None  # the torch.optim class this one replaces; None for Lamb and LARS
    _param_dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)  # what the kernels take
    # torch's GradScaler hands fused optimizers grad_scale / found_inf instead of unscaling gradients itself.
    _step_supports_amp_scaling = True

    def _init(self, params: Iterable[Any], arguments: dict[str, Any]) -> None:
        """Builds the group defaults from the concrete ``__init__``'s arguments (its ``locals()``).

        An argument left at its default takes the running torch's default instead (torch 1.13's Adam has
        ``fused=False``, 2.x ``fused=None``), so group dicts equal torch's; an argument torch's optimizer lacks
        (``decoupled_weight_decay`` before torch 2.7) enters the group only when set.
        """
        signature = inspect.signature(type(self).__init__).parameters
        mirror = self._torch_class is not None
        defaults = torch_group_defaults(self._torch_class) if self._torch_class is not None else {}
        defaults["lr"] = arguments["lr"]
        for key, parameter in signature.items():
            if key in ("self", "params", "lr"):
                continue
            value = arguments[key]
            value = tuple(value) if isinstance(value, list) else value
            left_at_default = parameter.default is not inspect.Parameter.empty and _same(value, parameter.default)
            if not (mirror and left_at_default):
                defaults[key] = value
        for key in ("capturable", "differentiable"):
            if defaults.get(key):
                raise NotImplementedError(
                    f"{type(self).__name__}: {key}=True is not supported; ember's fused step runs eagerly on CPU "
                    "tensors (CUDA graphs and autograd through the step are torch.optim's)"
                )
        self._check_hyperparameters(defaults)
        super().__init__(params, defaults)

    # -- torch.optim.Optimizer API ------------------------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        params = param_group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        seen: set[int] = set()
        for i, p in enumerate(params):
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"{type(self).__name__}: params[{i}] must be a torch.Tensor, got {type(p).__name__}")
            if p.device.type != "cpu":
                raise ValueError(f"{type(self).__name__}: params[{i}] must be a CPU tensor, got one on {p.device}")
            if p.dtype not in self._param_dtypes:
                names = " or ".join(str(d).replace("torch.", "") for d in self._param_dtypes)
                raise TypeError(
                    f"{type(self).__name__}: params[{i}] must be {names}, got {p.dtype}; for bf16 training use "
                    "ember.optimize(model, optimizer, dtype=torch.bfloat16)"
                )
            if id(p) in seen:
                raise ValueError(f"{type(self).__name__}: params[{i}] appears twice in one parameter group")
            seen.add(id(p))
        group = {**param_group, "params": params}
        self._check_hyperparameters({**self.defaults, **group})
        super().add_param_group(group)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch.optim's load_state_dict, then each state tensor in the form ember's kernels read: float32 for
        bf16 and split-BF16 parameters, and the parameter's memory layout.

        torch casts every floating state tensor to its parameter's dtype; ember's kernels keep bf16 parameters'
        state in fp32, so those entries are taken again from ``state_dict``, at full precision. A checkpoint saved
        from a row-major model loads into one whose convolutions ``ember.optimize`` made channels-last (and the
        other way round): the state is copied into the parameter's strides, values unchanged.
        """
        super().load_state_dict(state_dict)
        saved_ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        params = [p for group in self.param_groups for p in group["params"]]
        for saved_id, p in zip(saved_ids, params):
            saved = state_dict["state"].get(saved_id)
            if saved is None:
                continue
            for key, value in saved.items():
                if key == "step" or not isinstance(value, torch.Tensor) or not value.is_floating_point():
                    continue
                state = self.state[p]
                if p.dtype != torch.float32:
                    state[key] = value.to(dtype=torch.float32, copy=True)
                current = state[key]
                if current.shape == p.shape and current.stride() != p.stride() and not p.is_sparse:
                    state[key] = torch.empty_like(p, dtype=current.dtype).copy_(current)

    def __getstate__(self) -> dict[str, Any]:
        # torch pickles defaults, state and param_groups; the bottom halves of split parameters go along (their
        # keys are the parameters, so deepcopy maps them to the copies).
        state = super().__getstate__()
        state["_ember_bottoms"] = self._bottoms()
        return state

    # -- split-BF16 master weights ------------------------------------------------------------------------------

    @torch.no_grad()
    def split_master_weights(self, params: Iterable[torch.Tensor] | None = None) -> None:
        """Stores float32 parameters as split-BF16 master weights, in place.

        Each parameter's data becomes its bf16 top half (the tensor the model computes with, in the same memory
        layout), and this optimizer keeps its int16 bottom half. Every step then joins the halves into the exact
        fp32 value, updates it in fp32 and splits it again, in one pass: fp32 training results, with 4 bytes per
        weight instead of 4 + 2 for an fp32 master copy beside a bf16 model. A gradient already present is cast to
        bfloat16; later gradients are bf16, as autograd makes them for a bf16 parameter. Optimizer state is
        unchanged (fp32).

        Args:
            params: parameters of this optimizer to split (default: every float32 parameter of every group).
                Parameters already split are left as they are.
        """
        bottoms = self._bottoms()
        for p in self._own_params(params, "split_master_weights"):
            if p in bottoms:
                continue
            if p.dtype != torch.float32:
                if params is None:
                    continue  # bf16 parameters have no fp32 value to keep
                raise TypeError(
                    f"{type(self).__name__}.split_master_weights: a float32 parameter is needed, got {p.dtype}"
                )
            split_parameter(p, bottoms)

    @torch.no_grad()
    def join_master_weights(self, params: Iterable[torch.Tensor] | None = None) -> None:
        """Turns split-BF16 parameters back into float32 parameters holding their exact master values (and their
        gradients into float32). The inverse of :meth:`split_master_weights`; other parameters are left alone."""
        bottoms = self._bottoms()
        for p in self._own_params(params, "join_master_weights"):
            join_parameter(p, bottoms)

    def is_split(self, p: torch.Tensor) -> bool:
        """Whether ``p`` is a split-BF16 parameter of this optimizer."""
        return p in self._bottoms()

    @torch.no_grad()
    def master_weight(self, p: torch.Tensor) -> torch.Tensor:
        """The float32 value of parameter ``p``, as a new tensor: the exact join of a split parameter's halves, or
        the parameter's value widened to (or copied as) float32."""
        return master_value(p, self._bottoms())

    @torch.no_grad()
    def set_master_weight(self, p: torch.Tensor, value: torch.Tensor) -> None:
        """Sets parameter ``p`` to the float32 ``value`` (of p's shape): both halves of a split parameter (so a
        plain fp32 checkpoint is re-split exactly), or p itself, rounded to its dtype."""
        if not isinstance(value, torch.Tensor) or value.shape != p.shape:
            raise ValueError(
                f"{type(self).__name__}.set_master_weight: value must be a tensor of shape {tuple(p.shape)}, "
                f"got {tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__}"
            )
        set_master_value(p, value, self._bottoms())

    def _bottoms(self) -> dict[torch.Tensor, torch.Tensor]:
        """Parameter -> its int16 bottom half, for the split-BF16 parameters."""
        bottoms: dict[torch.Tensor, torch.Tensor] = self.__dict__.setdefault("_ember_bottoms", {})
        return bottoms

    def _own_params(self, params: Iterable[torch.Tensor] | None, caller: str) -> list[torch.Tensor]:
        mine = [p for group in self.param_groups for p in group["params"]]
        if params is None:
            return mine
        ids = {id(p) for p in mine}
        chosen = [params] if isinstance(params, torch.Tensor) else list(params)
        for i, p in enumerate(chosen):
            if id(p) not in ids:
                raise ValueError(f"{type(self).__name__}.{caller}: params[{i}] is not a parameter of this optimizer")
        return chosen

    # -- stepping -----------------------------------------------------------------------------------------------

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Performs one optimization step over every param group; ``closure`` re-evaluates the loss.

        Step pre- and post-hooks (``register_step_pre_hook``, global ones included) run as torch.optim runs them.
        torch wraps every optimizer's step in a profiler range that costs about 60 us a step even when no profiler
        runs; ember opens that range only while one does (``step.hooked`` tells torch not to wrap).
        """
        if profiler_enabled():
            with torch.autograd.profiler.record_function(f"Optimizer.step#{type(self).__name__}.step"):
                return self._step_with_hooks(closure)
        return self._step_with_hooks(closure)

    step.hooked = True  # type: ignore[attr-defined]

    def _step_with_hooks(self, closure: Callable[[], Any] | None) -> Any:
        args: tuple[Any, ...] = (self, closure)
        kwargs: dict[str, Any] = {}
        hooks = optimizer_step_hooks(self)
        if hooks is not None:
            for hook in hooks[0]:
                result = hook(self, args, kwargs)
                if result is not None:
                    if not (isinstance(result, tuple) and len(result) == 2):
                        raise RuntimeError(
                            f"{hook} must return None or a tuple of (new_args, new_kwargs), got {result}"
                        )
                    args, kwargs = result
        out = self._fused_step(*args[1:], **kwargs)
        if hooks is not None:
            mark_optimizer_stepped(self)
            for hook in hooks[1]:
                hook(self, args, kwargs)
        return out

    def _fused_step(self, closure: Callable[[], Any] | None = None) -> Any:
        # Not under torch.no_grad() (which costs a few microseconds a step): the kernels run outside autograd,
        # and the few torch ops on the way (state buffers from *_like factories, layout copies of gradients) make
        # tensors that do not require grad.
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # A GradScaler sets these as instance attributes for the duration of a step (torch's fused protocol).
        grad_scale = self.__dict__.get("grad_scale")
        found_inf = self.__dict__.get("found_inf")
        sync_threads()
        for group in self.param_groups:
            self._check_hyperparameters(group)
            self._step_group(group, _amp_scalar(grad_scale), _amp_scalar(found_inf))
        return loss

    # -- for subclasses -----------------------------------------------------------------------------------------

    def _check_hyperparameters(self, group: dict[str, Any]) -> None:
        raise NotImplementedError

    def _step_group(self, group: dict[str, Any], grad_scale: Any, found_inf: Any) -> None:
        raise NotImplementedError

    def _state_keys(self, group: dict[str, Any]) -> tuple[str, ...]:
        """The state entries the kernel takes for each parameter of ``group``, in the order it takes them."""
        raise NotImplementedError

    def _init_state(self, p: torch.Tensor, state: MutableMapping[str, Any], group: dict[str, Any]) -> None:
        """Creates the entries of ``_state_keys(group)`` that ``state`` lacks, as torch.optim creates them."""
        raise NotImplementedError

    # -- helpers for _step_group --------------------------------------------------------------------------------

    def _planned_step(self, group: dict[str, Any], params: list[torch.Tensor]) -> StepPlan:
        """The :class:`StepPlan` of a step of ``params`` (the group's parameters that have a gradient): the previous
        step's when it still matches, else a new one, with the state it needs created. Use it as a context manager
        around the kernel call: if the call raises, the state this plan created is taken back."""
        keys = self._state_keys(group)
        bottoms = self._bottoms()
        # Kept in __dict__ but not in __getstate__, so neither pickling nor deepcopy carries capsules along.
        plans: dict[int, StepPlan] = self.__dict__.setdefault("_ember_plans", {})
        plan = plans.get(id(group))
        if plan is None or not plan.matches(params, keys, self.state, bottoms):
            plan = StepPlan.build(params, keys, self.state, bottoms, lambda p, state: self._init_state(p, state, group))
            plans[id(group)] = plan
        return plan

    def _params_with_grad(
        self, group: dict[str, Any], sparse_ok: bool = False
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The group's parameters that have a gradient, and those gradients."""
        params, grads = params_with_grad(group["params"])
        if not sparse_ok and any_sparse(grads):
            raise RuntimeError(
                f"{type(self).__name__} does not support sparse gradients"
                + (", please consider SparseAdam instead" if "Adam" in type(self).__name__ else "")
            )
        return params, grads

    def _dense_params_with_grad(
        self, group: dict[str, Any], grad_scale: Any, found_inf: Any
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The group's parameters with dense gradients, and those gradients, after stepping the ones with sparse
        gradients (for optimizers whose torch.optim counterpart supports them: SGD, Adagrad) through
        :meth:`_torch_step`."""
        params, grads = self._params_with_grad(group, sparse_ok=True)
        if not any_sparse(grads):
            return params, grads
        self._torch_step(group, [p for p, g in zip(params, grads) if g.is_sparse], grad_scale, found_inf)
        dense = [(p, g) for p, g in zip(params, grads) if not g.is_sparse]
        return [p for p, _ in dense], [g for _, g in dense]

    def _torch_step(self, group: dict[str, Any], params: list[torch.Tensor], grad_scale: Any, found_inf: Any) -> None:
        """Steps ``params`` with torch.optim's own implementation, on this optimizer's state.

        For what torch supports and ember's kernels do not (sparse gradients): a throwaway torch optimizer gets the
        group's hyper-parameters and this optimizer's state dict, so the state it writes is the state ember keeps.
        """
        if grad_scale is not None or found_inf is not None:
            raise NotImplementedError(f"{type(self).__name__}: sparse gradients under a GradScaler are not supported")
        if any(self.is_split(p) for p in params):
            raise NotImplementedError(
                f"{type(self).__name__}: sparse gradients of split-BF16 parameters are not supported; keep such "
                "parameters (embeddings with sparse=True) out of split_master_weights"
            )
        hyper = {k: v for k, v in group.items() if k != "params"}
        if "foreach" in hyper:
            hyper["foreach"] = False  # torch's foreach paths refuse sparse gradients
        assert self._torch_class is not None, "sparse gradients reach torch's step only for torch's optimizers"
        delegate = self._torch_class([{**hyper, "params": params}])
        delegate.state = self.state
        delegate.step()


def _same(a: Any, b: Any) -> bool:
    return a is b or (type(a) is type(b) and a == b)


def _amp_scalar(value: Any) -> Any:
    if value is None:
        return None
    return dlpack(value.detach().to(torch.float32).reshape(1).contiguous())
