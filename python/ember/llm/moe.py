"""A mixture-of-experts MLP (Mixtral's, Qwen2-MoE's) on ember's matmuls: the router's top-k experts per token, each
expert's gated MLP on the rows routed to it, weighted by the router's probabilities, and Qwen2-MoE's shared expert
scaled by its sigmoid gate. Each expert's weights are read where they lie (a 3-D ``gate_up_proj`` of transformers 5
as row blocks of one expert's slice; transformers 4's per-expert Linears as they are).

The routing is data-dependent, so a decode step with an MoE layer is not recorded for replay (ops.Recording refuses
it): it runs call by call. Sums over experts are float32, rounded once with the residual added.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ember.llm import kernels

if TYPE_CHECKING:
    from ember.llm import ops


@dataclass
class Expert:
    gate: kernels.InPlaceLinear
    up: kernels.InPlaceLinear
    down: kernels.InPlaceLinear


@dataclass
class MoE:
    router: kernels.InPlaceLinear  # [experts, hidden]
    experts: list[Expert]
    top_k: int
    normalize: bool  # the top-k probabilities divided by their sum (Mixtral; Qwen2-MoE's norm_topk_prob)
    activation: str
    shared: Expert | None = None  # Qwen2-MoE's shared expert
    shared_gate: kernels.InPlaceLinear | None = None  # [1, hidden]: sigmoid(x @ w) scales the shared expert

    def forward(self, calls: ops.Calls, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + the mixture's output for the normed rows ``x`` [M, hidden]."""
        probs = torch.softmax(calls.linear(self.router, x).float(), dim=-1)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        out = residual.float()
        for e in chosen.unique().tolist():  # experts in index order, as Hugging Face's loop adds them
            rows, slot = torch.where(chosen == e)
            y = _gated(calls, self.experts[e], x[rows], self.activation)
            out.index_add_(0, rows, y.float() * weights[rows, slot, None])
        if self.shared is not None and self.shared_gate is not None:
            scale = torch.sigmoid(calls.linear(self.shared_gate, x).float())
            out += scale * _gated(calls, self.shared, x, self.activation).float()
        return out.to(x.dtype)


def _gated(calls: ops.Calls, expert: Expert, x: torch.Tensor, activation: str) -> torch.Tensor:
    gated = calls.linear(expert.gate, x, (activation,))
    return calls.linear(expert.down, calls.linear(expert.up, x, ("mul",), gated))


def is_moe(mlp: Any) -> bool:
    return hasattr(mlp, "experts") and hasattr(mlp, "gate")


def build(mlp: Any, config: Any, linear: Any, activation: str) -> MoE:
    """The MoE of ``mlp`` (a sparse MoE block), its linears made by ``linear(module_or_weight, rows=None)``."""
    experts_module = mlp.experts
    experts: list[Expert] = []
    if hasattr(experts_module, "gate_up_proj"):  # transformers 5: [E, 2I, H] and [E, H, I] parameters
        gate_up, down = experts_module.gate_up_proj.detach(), experts_module.down_proj.detach()
        inner = gate_up.shape[1] // 2
        for e in range(gate_up.shape[0]):
            experts.append(Expert(kernels.InPlaceLinear(gate_up[e, :inner], None),
                                  kernels.InPlaceLinear(gate_up[e, inner:], None),
                                  kernels.InPlaceLinear(down[e], None)))  # fmt: skip
    else:  # transformers 4: a ModuleList of per-expert MLPs (Mixtral's w1/w3/w2, Qwen2-MoE's gate/up/down)
        for expert in experts_module:
            names = ("w1", "w3", "w2") if hasattr(expert, "w1") else ("gate_proj", "up_proj", "down_proj")
            experts.append(Expert(*(linear(getattr(expert, n)) for n in names)))
    router = mlp.gate
    top_k = int(getattr(config, "num_experts_per_tok", 0) or getattr(router, "top_k", 2))
    normalize = bool(getattr(config, "norm_topk_prob", True))
    shared = None
    if getattr(mlp, "shared_expert", None) is not None:
        s = mlp.shared_expert
        shared = Expert(linear(s.gate_proj), linear(s.up_proj), linear(s.down_proj))
    shared_gate = getattr(mlp, "shared_expert_gate", None)
    return MoE(kernels.InPlaceLinear(router.weight.detach(), getattr(router, "bias", None)), experts, top_k,
               normalize, activation, shared, None if shared_gate is None else linear(shared_gate))  # fmt: skip
