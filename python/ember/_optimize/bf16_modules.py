"""Which parameters of a model ``ember.optimize(dtype=torch.bfloat16)`` stores as split-BF16, and why not the rest.

Converted: the parameters of the layers that hold almost all of a model's weights and whose math torch runs in
bf16 under autocast: Linear (and its subclasses, such as MultiheadAttention's out_proj), Bilinear, Conv1d/2d/3d,
ConvTranspose1d/2d/3d, MultiheadAttention's input projections, Embedding; and EmbeddingBag, LSTM, GRU and RNN when
the running torch can train them in bf16 on this CPU (asked once per process with a tiny forward and backward:
torch 1.13 has no bf16 EmbeddingBag, and torch 2.x runs bf16 LSTMs through oneDNN, which needs AVX512-BF16 or AMX).

Kept float32: normalisation layers (BatchNorm, LayerNorm, GroupNorm, InstanceNorm). They hold well under 1% of a
model's parameters, so bf16 would save next to nothing, and torch's CPU kernels take their fp32 scale and shift
with bf16 activations as they are. Parameters of any other module (a custom module's own ``nn.Parameter``, such as a
learned positional embedding) stay float32 too: ember does not know what their module does with them; autocast
decides the precision of their ops. A probed layer that torch cannot run in bf16 here runs with autocast off and
fp32 inputs, since autocast would send it to the same bf16 kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

_ALWAYS = (
    nn.Linear,
    nn.Bilinear,
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
    nn.MultiheadAttention,
    nn.Embedding,
)
_PROBED = (nn.EmbeddingBag, nn.LSTM, nn.GRU, nn.RNN)
_NORMS = (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm, nn.modules.instancenorm._InstanceNorm)


@dataclass
class Bf16Selection:
    """The outcome of :func:`select_bf16_parameters`: parameters to split, and the others with the reason."""

    chosen: list[tuple[str, nn.Parameter]] = field(default_factory=list)
    left: list[tuple[str, str]] = field(default_factory=list)


def select_bf16_parameters(model: nn.Module) -> Bf16Selection:
    """The float32 parameters of ``model`` to store as split-BF16, by qualified name, each parameter once (a tied
    parameter under the name of its first owner, in ``named_modules`` order)."""
    selection = Bf16Selection()
    seen: set[int] = set()
    self_training = _self_training_tables(model)
    for module_name, module in model.named_modules():
        for name, p in module.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            qualified = f"{module_name}.{name}" if module_name else name
            reason = self_training.get(id(module)) or _why_not(module, p)
            if reason is None:
                selection.chosen.append((qualified, p))
            else:
                selection.left.append((qualified, reason))
    return selection


def _self_training_tables(model: nn.Module) -> dict[int, str]:
    """The tables of merged embedding bags that step themselves (ember.nn.MergedEmbeddingBagWith*): the optimizer
    never sees their gradients, so they split their own weights (``split_bf16_``), not the optimizer."""
    from ember.nn.embedding_bag_fused import is_self_training

    return {id(table): f"trained by its {type(m).__name__}, which splits its own tables"
            for m in model.modules() if is_self_training(m) for table in m}  # fmt: skip


def split_self_training_tables(model: nn.Module) -> int:
    """Splits the float32 tables of every self-training merged embedding bag of ``model``; returns how many modules."""
    from ember.nn.embedding_bag_fused import is_self_training

    modules = [m for m in model.modules() if is_self_training(m) and any(t.weight.dtype == torch.float32 for t in m)]
    for m in modules:
        m.split_bf16_()
    return len(modules)


def layers_kept_float32(model: nn.Module) -> list[nn.Module]:
    """The probed layers of ``model`` that torch cannot run in bf16 here; autocast must not send them to bf16 either."""
    return [m for m in model.modules() if isinstance(m, _PROBED) and _bf16_training_failure(_base_of(m)) is not None]


def _why_not(module: nn.Module, p: nn.Parameter) -> str | None:
    if p.dtype != torch.float32:
        return f"already {str(p.dtype).replace('torch.', '')}"
    if p.device.type != "cpu":
        return f"on {p.device}, not the CPU"
    if isinstance(module, _NORMS):
        return f"{type(module).__name__}: normalisation layers keep float32 scale and shift (well under 1% of weights)"
    if isinstance(module, _ALWAYS):
        return None
    if isinstance(module, _PROBED):
        failure = _bf16_training_failure(_base_of(module))
        return None if failure is None else f"{type(module).__name__}: {failure}"
    return f"{type(module).__name__} is not a layer ember converts; autocast decides its ops' precision"


def _base_of(module: nn.Module) -> type[nn.Module]:
    return next(base for base in _PROBED if isinstance(module, base))


def _bf16_training_failure(kind: type[nn.Module]) -> str | None:
    """Why the running torch cannot train a ``kind`` layer with bf16 weights on this CPU, or None if it can (probed
    once per kind and process)."""
    if kind not in _failures:
        _failures[kind] = _probe_bf16_training(kind)
    return _failures[kind]


_failures: dict[type[nn.Module], str | None] = {}


def _probe_bf16_training(kind: type[nn.Module]) -> str | None:
    torch_version = torch.__version__.split("+")[0]
    try:
        if kind is nn.EmbeddingBag:
            layer: nn.Module = nn.EmbeddingBag(4, 2, mode="sum")
            inputs: tuple[torch.Tensor, ...] = (torch.tensor([0, 1, 3]), torch.tensor([0, 2]))
        else:
            layer = kind(2, 2, batch_first=True)
            inputs = (torch.ones(1, 2, 2),)
        for p in layer.parameters():
            p.data = p.data.to(torch.bfloat16)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = layer(*inputs)
        out = out[0] if isinstance(out, tuple) else out
        out.float().sum().backward()
        if any(p.grad is None or p.grad.dtype != torch.bfloat16 for p in layer.parameters()):
            return f"torch {torch_version} does not give bf16 gradients for it"
    except (RuntimeError, TypeError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        return f"torch {torch_version} cannot train it in bf16 on this CPU ({reason})"
    return None
