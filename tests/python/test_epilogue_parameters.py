"""The epilogue's activations that take parameters (and Mish), and its multiplication by a tensor (a gated MLP's
product), through ember._C's Linear and Convolution: each against torch's own function, the parameters read from the
entry's text, bad entries refused with nothing written."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from ember import _C
from ember._tensor import dlpack

# (epilogue entry, torch's function of the layer's output)
CASES = [
    ("mish", F.mish),
    ("elu(0.7)", lambda y: F.elu(y, alpha=0.7)),
    ("elu(1)", F.elu),
    ("leaky_relu(0.1)", lambda y: F.leaky_relu(y, 0.1)),
    ("clamp(-0.5, 0.75)", lambda y: torch.clamp(y, -0.5, 0.75)),
    ("clamp(0, inf)", lambda y: torch.clamp(y, min=0.0)),
    ("clamp(-inf, 1)", lambda y: torch.clamp(y, max=1.0)),
    ("affine(2.5, 0)", lambda y: y * 2.5),
    ("affine(1, -0.125)", lambda y: y + -0.125),
    ("affine(3, 0.5)", lambda y: y * 3.0 + 0.5),
]


def linear_with(entry: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    layer = _C.Linear(dlpack(weight), dlpack(bias), "float32", False)
    out = torch.empty(x.shape[0], weight.shape[0])
    layer.forward(dlpack(x), dlpack(weight), dlpack(out), [entry])
    return out


@pytest.mark.parametrize(("entry", "reference"), CASES, ids=[c[0] for c in CASES])
def test_linear_epilogue_matches_torch(entry, reference) -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 24, generator=gen) * 3
    weight = torch.randn(40, 24, generator=gen) / 3
    bias = torch.randn(40, generator=gen)
    got = linear_with(entry, x, weight, bias)
    expected = reference(F.linear(x, weight, bias))
    torch.testing.assert_close(got, expected, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize(("entry", "reference"), CASES[:5], ids=[c[0] for c in CASES[:5]])
def test_convolution_epilogue_matches_torch(entry, reference) -> None:
    if not _C.Convolution.supported("float32"):
        pytest.skip("oneDNN has no fp32 convolution here")
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 4, 9, 9, generator=gen) * 2
    weight = torch.randn(6, 4, 3, 3, generator=gen) / 4
    bias = torch.randn(6, generator=gen)
    x_last = x.contiguous(memory_format=torch.channels_last)
    conv = _C.Convolution(
        dlpack(weight), dlpack(bias), [1, 1], [1, 1], [1, 1], [1, 1], 1, False, "float32", dlpack(x_last)
    )
    out = torch.empty(2, 6, 9, 9).contiguous(memory_format=torch.channels_last)
    conv.forward(dlpack(x_last), dlpack(out), [entry])
    expected = reference(F.conv2d(x, weight, bias, padding=1))
    torch.testing.assert_close(out, expected, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("elu", "takes 1 parameter"),
        ("relu(1)", "takes 0 parameter"),
        ("clamp(1)", "takes 2 parameter"),
        ("clamp(2, 1)", "min <= max"),
        ("clamp(nan, 1)", "min <= max"),
        ("leaky_relu(inf)", "finite"),
        ("affine(1, x)", "cannot read"),
        ("elu(1", "closing parenthesis"),
        ("swish", "must be relu"),
    ],
)
def test_bad_entries_are_refused_and_nothing_is_written(entry, message) -> None:
    x, weight, bias = torch.randn(3, 8), torch.randn(4, 8), torch.randn(4)
    layer = _C.Linear(dlpack(weight), dlpack(bias), "float32", False)
    out = torch.full((3, 4), math.pi)
    with pytest.raises(ValueError, match=message):
        layer.forward(dlpack(x), dlpack(weight), dlpack(out), [entry])
    assert torch.equal(out, torch.full((3, 4), math.pi))


@pytest.mark.parametrize("rows", [1, 3, 40, 300])  # the skinny matmul, then oneDNN
@pytest.mark.parametrize("compute", ["float32", "bfloat16"])
def test_a_gated_product_multiplies_by_the_operand_on_every_kernel(rows: int, compute: str) -> None:
    """["silu", "mul"]: silu(x W1ᵀ) * up on the kernel that takes each row count, in the layer's precision."""
    if not _C.Linear.supported(compute):
        pytest.skip(f"ember has no {compute} Linear here")
    gen = torch.Generator().manual_seed(rows)
    dtype = getattr(torch, compute)
    x = torch.randn(rows, 64, generator=gen).to(dtype)
    weight = (torch.randn(200, 64, generator=gen) / 8).to(dtype)
    up = torch.randn(rows, 200, generator=gen).to(dtype)
    layer = _C.Linear(dlpack(weight), None, compute, False)
    out = torch.empty(rows, 200, dtype=dtype)
    layer.forward(dlpack(x), dlpack(weight), dlpack(out), ["silu", "mul"], dlpack(up))
    expected = F.silu(F.linear(x.double(), weight.double())) * up.double()
    tol = 2e-5 if compute == "float32" else 2e-2
    torch.testing.assert_close(out.double(), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    ("entries", "operand", "message"),
    [
        (["mul"], False, "residual must be given"),
        (["relu"], True, "only when the epilogue has an add or multiply"),
        (["add", "mul"], True, "at most one add or multiply"),
        (["mul", "relu", "mul"], True, "at most one add or multiply"),
    ],
)
def test_a_product_needs_its_one_operand(entries: list[str], operand: bool, message: str) -> None:
    x, weight = torch.randn(3, 8), torch.randn(4, 8)
    layer = _C.Linear(dlpack(weight), None, "float32", False)
    out = torch.full((3, 4), math.pi)
    with pytest.raises(ValueError, match=message):
        layer.forward(dlpack(x), dlpack(weight), dlpack(out), entries, dlpack(torch.ones(3, 4)) if operand else None)
    assert torch.equal(out, torch.full((3, 4), math.pi))
