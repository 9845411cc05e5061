"""What the decoder's calls (ops.py) hold besides tensors: a Linear layer on its weight where it lies (no packed
copy: a generation model's weights are most of the host's memory, and decode reads each once a token), and a row
norm's parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ember import _C
from ember._tensor import dlpack, torch_fp32_matmul_is_mkl_on_intel

_COMPUTE = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


class InPlaceLinear:
    """``epilogue(x @ weight.T + bias)`` for a [N, K] weight read where it lies (an ``nn.Linear``'s, or a block of
    its rows). The router (csrc/linear/) picks the kernel per row count: the skinny matmul for decode's few rows,
    oneDNN for a prompt's; where it names torch's own matmul the faster one, F.linear runs and the epilogue follows
    in torch. A weight whose rows are not contiguous along K (GPT-2's Conv1D, [in, out], read transposed) is packed
    once into oneDNN's layout instead (a copy: such models are small)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = weight.detach()
        self.bias = None if bias is None else bias.detach()
        self.compute = _COMPUTE[self.weight.dtype]
        self.in_place = self.weight.stride(-1) == 1
        kernel_bias = None if self.bias is None else dlpack(self.bias.contiguous())
        self.kernel = _C.Linear(dlpack(self.weight), kernel_bias, self.compute, not self.in_place)
        self._torch_rows: dict[int, bool] = {}  # rows -> whether torch's matmul serves them

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])

    def runs_in_torch(self, rows: int) -> bool:
        """Whether torch's F.linear is the faster kernel for inputs of ``rows`` rows (the router's answer, kept)."""
        known = self._torch_rows.get(rows)
        if known is None:
            route = _C.Linear.route(
                self.compute, rows, dlpack(self.weight), self.in_place, torch_fp32_matmul_is_mkl_on_intel()
            )
            known = self._torch_rows[rows] = route == "caller"
        return known

    def torch_forward(
        self, x: torch.Tensor, epilogue: Sequence[str] = (), operand: torch.Tensor | None = None
    ) -> torch.Tensor:
        out = F.linear(x, self.weight, self.bias)
        for entry in epilogue:
            out = _torch_epilogue(entry, out, operand)
        return out

    def forward_into(
        self, x: torch.Tensor, out: torch.Tensor, epilogue: Sequence[str] = (), operand: torch.Tensor | None = None
    ) -> None:
        """out [M, N] = epilogue(x [M, K] @ weight.T + bias) on ember's kernel (``operand`` [M, N] for an "add" or
        "mul" entry)."""
        weight = dlpack(self.weight) if self.in_place else None
        self.kernel.forward(dlpack(x), weight, dlpack(out), list(epilogue),
                            None if operand is None else dlpack(operand))  # fmt: skip


def _torch_epilogue(entry: str, out: torch.Tensor, operand: torch.Tensor | None) -> torch.Tensor:
    if entry == "add":
        assert operand is not None
        return out + operand
    if entry == "mul":
        assert operand is not None
        return out * operand
    if entry == "silu":
        return F.silu(out)
    if entry == "gelu":
        return F.gelu(out)
    if entry == "gelu_tanh":
        return F.gelu(out, approximate="tanh")
    if entry == "relu":
        return F.relu(out)
    raise ValueError(f"unknown epilogue entry {entry!r}")


@dataclass(frozen=True)
class Norm:
    """A row norm's parameters: kind "rms" (RMSNorm) or "layer" (LayerNorm), weight, bias (LayerNorm's, or None),
    epsilon."""

    kind: str
    weight: torch.Tensor
    bias: torch.Tensor | None
    eps: float
