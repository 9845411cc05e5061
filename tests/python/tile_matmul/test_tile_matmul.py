"""The tile matmul (csrc/tile_matmul/) through ember._C's Linear: the kernel the router names for a prepacked bf16
layer at 96 to 320 rows, results against torch's bf16 matmul in float64 on the same bf16 numbers (rows,
columns and k that leave tails; every epilogue kind; a residual), the ``kernel`` choice of ``Linear.forward`` that
benchmarks use, and the calls it refuses with nothing written. The float64 sweep over every tail and the thread
counts is tests/cpp/test_tile_matmul.cpp."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ember import _C
from ember._tensor import dlpack

AMX = _C.active_isa() == "amx"
needs_amx = pytest.mark.skipif(not AMX, reason="the tile matmul runs on AMX only")
needs_bf16 = pytest.mark.skipif(not _C.Linear.supported("bfloat16"), reason="oneDNN has no bf16 matmul here")


def bf16_layer(n: int, k: int, seed: int) -> tuple[_C.Linear, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    weight = (torch.randn(n, k, generator=gen) / k**0.5).bfloat16().float()  # exact in bf16
    bias = torch.randn(n, generator=gen)
    return _C.Linear(dlpack(weight), dlpack(bias), "bfloat16", True), weight, bias


@needs_bf16
@pytest.mark.parametrize("rows", [1, 32, 95, 96, 128, 197, 320, 321, 2048])
def test_the_router_sends_it_tens_to_hundreds_of_rows(rows) -> None:
    layer, weight, _ = bf16_layer(768, 768, 0)
    in_range = _C.Linear.route("bfloat16", rows, dlpack(weight), False, False) == "tiles"
    assert in_range == (AMX and 96 <= rows <= 320)  # csrc/tile_matmul/tile_matmul.h: kMinRows, kMaxRows
    assert (layer.implementation(rows) == "ember:tiles:amx") == in_range


@needs_amx
@pytest.mark.parametrize(("rows", "n", "k"), [(128, 768, 768), (33, 100, 70), (200, 48, 31), (385, 16, 300)])
@pytest.mark.parametrize("epilogue", [[], ["gelu"], ["add"], ["silu", "mul"]])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_matches_torch_in_float64(rows, n, k, epilogue, out_dtype) -> None:
    layer, weight, bias = bf16_layer(n, k, rows + n + k)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(rows, k, generator=gen).bfloat16()
    operand = torch.randn(rows, n, generator=gen).to(out_dtype)
    out = torch.full((rows, n), float("nan"), dtype=out_dtype)
    reads = "add" in epilogue or "mul" in epilogue
    layer.forward(dlpack(x), None, dlpack(out), epilogue, dlpack(operand) if reads else None, kernel="tiles")
    y = x.double() @ weight.double().t() + bias.double()
    for entry in epilogue:
        y = {"gelu": F.gelu, "silu": F.silu, "add": lambda v: v + operand.double(),
             "mul": lambda v: v * operand.double()}[entry](y)  # fmt: skip
    scale = x.double().abs() @ weight.double().abs().t() + bias.double().abs() + operand.double().abs() + 1
    tol = 1e-5 * scale * (operand.double().abs() + 1) + (2**-8 * y.abs() if out_dtype == torch.bfloat16 else 0)
    assert ((out.double() - y).abs() <= tol).all()


@needs_amx
def test_the_kernel_choice_gives_the_same_layer_on_either_kernel() -> None:
    layer, _, _ = bf16_layer(3072, 768, 1)
    x = torch.randn(128, 768).bfloat16()
    outs = {}
    for kernel in ("tiles", "onednn"):
        outs[kernel] = torch.empty(128, 3072)
        layer.forward(dlpack(x), None, dlpack(outs[kernel]), ["gelu"], None, kernel=kernel)
    routed = torch.empty(128, 3072)
    layer.forward(dlpack(x), None, dlpack(routed), ["gelu"])
    assert torch.equal(routed, outs["tiles"])
    torch.testing.assert_close(outs["tiles"], outs["onednn"], rtol=2e-2, atol=2e-2)  # oneDNN stores bf16 first


def test_refuses_what_it_cannot_run_with_nothing_written() -> None:
    weight = torch.randn(40, 64)
    layer = _C.Linear(dlpack(weight), None, "float32", True)
    x, out = torch.randn(64, 64), torch.zeros(64, 40)
    with pytest.raises(ValueError, match="must be None, 'onednn' or 'tiles'"):
        layer.forward(dlpack(x), None, dlpack(out), kernel="skinny")
    with pytest.raises(ValueError, match="packed bfloat16 copy"):
        layer.forward(dlpack(x), None, dlpack(out), kernel="tiles")
    assert not out.any()
    layer.forward(dlpack(x), None, dlpack(out), kernel="onednn")
    torch.testing.assert_close(out, x @ weight.t(), rtol=1e-5, atol=1e-5)
