"""ember.nn.FrozenBatchNorm2d against torchvision's formula in float64 (and torchvision's module where it imports):
layouts, dtype promotion, backward, gradcheck, checkpoints, the operator under torch.fx and torch.compile."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ember
from ember.nn import FrozenBatchNorm2d
from ember.nn.functional import frozen_batch_norm

HAS_COMPILE = hasattr(torch, "compile") and hasattr(torch.library, "register_fake")

try:
    from torchvision.ops import FrozenBatchNorm2d as TorchvisionFrozenBatchNorm2d
except Exception:
    TorchvisionFrozenBatchNorm2d = None


def reference(x: torch.Tensor, m: FrozenBatchNorm2d) -> torch.Tensor:
    """torchvision's formula in float64."""
    scale = m.weight.double() * (m.running_var.double() + m.eps).rsqrt()
    shift = m.bias.double() - m.running_mean.double() * scale
    return x.double() * scale.reshape(1, -1, 1, 1) + shift.reshape(1, -1, 1, 1)


def module(channels: int, gen: torch.Generator, dtype: torch.dtype = torch.float32) -> FrozenBatchNorm2d:
    m = FrozenBatchNorm2d(channels)
    m.weight.copy_(torch.randn(channels, generator=gen))
    m.bias.copy_(torch.randn(channels, generator=gen))
    m.running_mean.copy_(torch.randn(channels, generator=gen))
    m.running_var.copy_(torch.rand(channels, generator=gen) + 0.1)
    return m.to(dtype)


@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "strided"])
@pytest.mark.parametrize(("x_dtype", "buffer_dtype"), [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                                                       (torch.bfloat16, torch.bfloat16)])  # fmt: skip
def test_matches_torchvisions_formula(isa_level, layout, x_dtype, buffer_dtype, gen):
    m = module(37, gen, buffer_dtype)
    x = torch.randn(2, 37, 6, 9, generator=gen).to(x_dtype)
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    elif layout == "strided":
        x = torch.randn(2, 37, 6, 18, generator=gen).to(x_dtype)[..., ::2]
    x.requires_grad_()
    out = m(x)
    expect_dtype = torch.result_type(x, m.weight)
    assert out.dtype == expect_dtype and out.shape == x.shape
    if layout == "channels_last":
        assert out.is_contiguous(memory_format=torch.channels_last)
    exact, rounded = {"atol": 1e-5, "rtol": 1e-5}, {"atol": 2e-2, "rtol": 2**-7}  # float32, or one bf16 rounding
    torch.testing.assert_close(
        out.double(), reference(x.detach(), m), **(rounded if out.dtype != torch.float32 else exact)
    )
    grad = torch.randn(out.shape, generator=gen).to(out.dtype)
    (grad_x,) = torch.autograd.grad(out, x, grad)
    assert grad_x.dtype == x.dtype
    scale = (m.weight.double() * (m.running_var.double() + m.eps).rsqrt()).reshape(1, -1, 1, 1)
    torch.testing.assert_close(
        grad_x.double(), grad.double() * scale, **(rounded if x.dtype != torch.float32 else exact)
    )


@pytest.mark.skipif(TorchvisionFrozenBatchNorm2d is None, reason="torchvision does not import here")
def test_matches_torchvisions_module(gen):
    ours = module(16, gen)
    theirs = TorchvisionFrozenBatchNorm2d(16)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(3, 16, 8, 8, generator=gen)
    torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)
    assert repr(ours) == repr(theirs)
    assert FrozenBatchNorm2d.from_module(theirs).weight is theirs.weight


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_gradcheck_float64(layout, gen):
    # float64 x and buffers run the kernel's double path (forward and backward): gradcheck at its float64 defaults.
    m = module(5, gen, torch.float64)
    x = torch.randn(2, 5, 3, 4, generator=gen, dtype=torch.float64)
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    x.requires_grad_()
    assert torch.autograd.gradcheck(m, (x,))


def test_checkpoints_and_repr(gen):
    bn = nn.BatchNorm2d(5)
    bn.running_mean.copy_(torch.randn(5, generator=gen))
    frozen = FrozenBatchNorm2d(5)
    frozen.load_state_dict(bn.state_dict())  # num_batches_tracked dropped, as torchvision does
    assert torch.equal(frozen.running_mean, bn.running_mean)
    assert list(frozen.state_dict()) == ["weight", "bias", "running_mean", "running_var"]
    assert repr(frozen) == "FrozenBatchNorm2d(5, eps=1e-05)"
    assert list(frozen.parameters()) == []


def test_float64_runs_on_the_kernel_in_double(gen):
    m = module(4, gen).double()
    x = torch.randn(1, 4, 3, 3, generator=gen, dtype=torch.float64)
    traced = torch.fx.symbolic_trace(nn.Sequential(m))
    assert [n.target for n in traced.graph.nodes if n.op == "call_function"] == [torch.ops.ember.frozen_batch_norm]
    torch.testing.assert_close(m(x), reference(x, m), atol=1e-14, rtol=1e-14)
    # float64 x with float32 buffers is torchvision's mixed formula (a float32 scale, promoted), not the kernel's.
    mixed = module(4, gen)
    scale = mixed.weight * (mixed.running_var + mixed.eps).rsqrt()
    shift = mixed.bias - mixed.running_mean * scale
    torch.testing.assert_close(mixed(x), x * scale.reshape(1, -1, 1, 1) + shift.reshape(1, -1, 1, 1))


def test_one_operator_under_fx(gen):
    traced = torch.fx.symbolic_trace(nn.Sequential(module(4, gen)))
    calls = [n.target for n in traced.graph.nodes if n.op == "call_function"]
    assert calls == [torch.ops.ember.frozen_batch_norm]


@pytest.mark.skipif(not HAS_COMPILE, reason="torch.compile with fake kernels needs torch >= 2.4")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # inductor's own imports
def test_torch_compile_without_a_break(gen):
    m = module(8, gen)
    x = torch.randn(2, 8, 4, 4, generator=gen, requires_grad=True)
    compiled = torch.compile(lambda x: m(x).square().sum(), fullgraph=True)
    compiled(x).backward()
    expect = torch.autograd.grad(reference(x, m).square().sum(), x)[0]
    torch.testing.assert_close(x.grad, expect.float(), atol=1e-4, rtol=1e-4)


def test_bad_input_raises_a_clear_error(gen):
    m = module(4, gen)
    with pytest.raises(ValueError, match=r"weight must be \[3\]"):
        frozen_batch_norm(torch.ones(1, 3, 2, 2), m.weight, m.bias, m.running_mean, m.running_var)
    with pytest.raises(ValueError, match="eps must be a finite number"):
        frozen_batch_norm(torch.ones(1, 4, 2, 2), m.weight, m.bias, m.running_mean, m.running_var, eps=-1.0)
    with pytest.raises(ValueError, match="at least 2-D"):
        frozen_batch_norm(torch.ones(4), m.weight, m.bias, m.running_mean, m.running_var)


def test_the_kernel_runs_at_the_expected_level(isa_level):
    level = ember._C.frozen_batch_norm_implementation()
    assert level == ("ref" if isa_level == "ref" else "avx2" if isa_level == "avx2" else "avx512")


def torchvision_like_frozen_bn() -> type[nn.Module]:
    """torchvision's FrozenBatchNorm2d where it imports; else a class with its module path, name and state."""
    if TorchvisionFrozenBatchNorm2d is not None:
        return TorchvisionFrozenBatchNorm2d

    class Standin(nn.Module):
        def __init__(self, n: int, eps: float = 1e-5) -> None:
            super().__init__()
            self.eps = eps
            for name, fill in (("weight", 1.0), ("bias", 0.0), ("running_mean", 0.0), ("running_var", 1.0)):
                self.register_buffer(name, torch.full((n,), fill))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            scale = self.weight * (self.running_var + self.eps).rsqrt()
            return x * scale.reshape(1, -1, 1, 1) + (self.bias - self.running_mean * scale).reshape(1, -1, 1, 1)

    Standin.__module__, Standin.__name__, Standin.__qualname__ = (
        "torchvision.ops.misc",
        "FrozenBatchNorm2d",
        "FrozenBatchNorm2d",
    )
    return Standin


@pytest.mark.parametrize("train", [False, True])
def test_ember_optimize_swaps_torchvisions_frozen_batch_norm(train, gen):
    kind = torchvision_like_frozen_bn()
    model = nn.Sequential(nn.Conv2d(3, 8, 3), kind(8), nn.ReLU())
    with torch.no_grad():
        model[1].running_mean.copy_(torch.randn(8, generator=gen))
    x = torch.randn(2, 3, 10, 10, generator=gen)
    expect = model(x)
    keys = list(model.state_dict())
    if train:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        optimized, _ = ember.optimize(model.train(), optimizer=optimizer)
    else:
        optimized = ember.optimize(model.eval())
    assert type(optimized[1]) is FrozenBatchNorm2d
    assert type(model[1]) is kind  # the original model is left as it was (inplace=False)
    assert list(optimized.state_dict()) == keys
    torch.testing.assert_close(optimized(x), expect, atol=1e-4, rtol=1e-4)
