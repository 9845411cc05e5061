"""The tile matmul and the few-row matmul (csrc/tile_matmul/) through ember._C's Linear: the kernel the router names
for a prepacked bf16 layer at 1 to 4 rows (few-row, AVX512-BF16) and 96 to 320 (tiles, AMX), results against torch's
bf16 matmul in float64 on the same bf16 numbers (rows, columns and k that leave tails; every epilogue kind; a
residual), the ``kernel`` choice of ``Linear.forward`` that benchmarks use, and the calls it refuses with nothing
written. The float64 sweep over every tail and the thread counts is tests/cpp/test_tile_matmul.cpp."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ember import _C
from ember._tensor import dlpack

AMX = _C.active_isa() == "amx"
needs_amx = pytest.mark.skipif(not AMX, reason="the tile matmul runs on AMX only")
needs_bf16 = pytest.mark.skipif(not _C.Linear.supported("bfloat16"), reason="oneDNN has no bf16 matmul here")


def few_rows_run() -> bool:
    """Whether the few-row matmul runs here: AVX512-BF16, and oneDNN packing bf16 weights in the layout it reads."""
    if not _C.Linear.supported("bfloat16"):
        return False
    layer = _C.Linear(dlpack(torch.randn(64, 64)), None, "bfloat16", True)
    return layer.implementation(1) == "ember:few_rows:avx512_bf16"


needs_few_rows = pytest.mark.skipif(not few_rows_run(), reason="no AVX512-BF16, or another packed layout here")


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


@needs_bf16
@pytest.mark.parametrize("rows", [1, 3, 4, 5])
def test_the_router_sends_decoded_rows_to_the_few_row_matmul(rows) -> None:
    layer, weight, _ = bf16_layer(384, 384, 0)
    few = _C.Linear.route("bfloat16", rows, dlpack(weight), False, False) == "few_rows"
    assert few == (few_rows_run() and rows <= 4)  # csrc/tile_matmul/tile_matmul.h: kMaxFewRows
    assert (layer.implementation(rows) == "ember:few_rows:avx512_bf16") == few


CASES = [("tiles", 128, 768, 768), ("tiles", 33, 100, 70), ("tiles", 200, 48, 31), ("tiles", 385, 16, 300)]
CASES += [("few_rows", 1, 384, 384), ("few_rows", 4, 100, 70), ("few_rows", 2, 48, 31), ("few_rows", 3, 1000, 1)]


@pytest.mark.parametrize(("kernel", "rows", "n", "k"), CASES)
@pytest.mark.parametrize("epilogue", [[], ["gelu"], ["add"], ["silu", "mul"]])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_matches_torch_in_float64(kernel, rows, n, k, epilogue, out_dtype) -> None:
    if kernel == "tiles" and not AMX:
        pytest.skip("the tile matmul runs on AMX only")
    if kernel == "few_rows" and not few_rows_run():
        pytest.skip("no AVX512-BF16, or another packed layout here")
    layer, weight, bias = bf16_layer(n, k, rows + n + k)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(rows, k, generator=gen).bfloat16()
    operand = torch.randn(rows, n, generator=gen).to(out_dtype)
    out = torch.full((rows, n), float("nan"), dtype=out_dtype)
    reads = "add" in epilogue or "mul" in epilogue
    layer.forward(dlpack(x), None, dlpack(out), epilogue, dlpack(operand) if reads else None, kernel=kernel)
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
    with pytest.raises(ValueError, match="must be None, 'onednn', 'tiles' or 'few_rows'"):
        layer.forward(dlpack(x), None, dlpack(out), kernel="skinny")
    for kernel in ("tiles", "few_rows"):
        with pytest.raises(ValueError, match="packed bfloat16 copy"):
            layer.forward(dlpack(x), None, dlpack(out), kernel=kernel)
    assert not out.any()
    if few_rows_run():
        bf16, _, _ = bf16_layer(40, 64, 2)
        five, five_out = torch.randn(5, 64).bfloat16(), torch.zeros(5, 40)
        with pytest.raises(ValueError, match="at most 4 rows"):
            bf16.forward(dlpack(five), None, dlpack(five_out), kernel="few_rows")
        assert not five_out.any()
    layer.forward(dlpack(x), None, dlpack(out), kernel="onednn")
    torch.testing.assert_close(out, x @ weight.t(), rtol=1e-5, atol=1e-5)
