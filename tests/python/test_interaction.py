"""ember.nn.functional.interaction against DLRM's composite (cat, bmm, tril gather, cat) in float64, forward and
backward on every ISA path, gradcheck, the operator under torch.fx and torch.compile, and bad input."""

from __future__ import annotations

import pytest
import torch

import ember
from ember.nn.functional import interaction

HAS_COMPILE = hasattr(torch, "compile") and hasattr(torch.library, "register_fake")


def composite(dense: torch.Tensor, *sparse: torch.Tensor) -> torch.Tensor:
    """DLRM's interact_features (dot, no self-interaction)."""
    x = torch.stack([dense, *sparse], dim=1)
    z = torch.bmm(x, x.transpose(1, 2))
    li, lj = torch.tril_indices(x.shape[1], x.shape[1], offset=-1)
    return torch.cat([dense, z[:, li, lj]], dim=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("tables", "dim"), [(0, 8), (1, 1), (4, 13), (26, 128)])
def test_matches_the_composite_in_float64(isa_level, dtype, tables, dim, gen):
    xs = [torch.randn(9, dim, generator=gen).to(dtype).requires_grad_() for _ in range(tables + 1)]
    out = interaction(*xs)
    ref_in = [x.detach().double().requires_grad_() for x in xs]
    ref = composite(*ref_in)
    assert out.dtype == dtype and out.shape == ref.shape
    # float32 sums of products of bf16-exact inputs, rounded once to the output dtype.
    tol = {"atol": 1e-2, "rtol": 2**-8} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(out.double(), ref, **tol)
    grad = torch.randn(out.shape, generator=gen).to(dtype)
    grads = torch.autograd.grad(out, xs, grad)
    expect = torch.autograd.grad(ref, ref_in, grad.double())
    for g, e in zip(grads, expect):
        assert g.dtype == dtype
        torch.testing.assert_close(g.double(), e, **tol)


def test_gradcheck_float64(gen):
    # float64 runs the kernel's double path: gradcheck at its float64 defaults, a dense input and five sparse ones
    # of an odd width (vector and tail columns on the float paths; every column on this one).
    xs = tuple(torch.randn(3, 7, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(6))
    assert torch.autograd.gradcheck(interaction, xs)


def test_float64_matches_the_composite_to_double_rounding(gen):
    xs = [torch.randn(9, 33, generator=gen, dtype=torch.float64) for _ in range(8)]
    out = interaction(*xs)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, composite(*xs), atol=1e-12, rtol=1e-12)


def test_only_the_inputs_that_need_it_get_a_gradient(gen):
    dense = torch.randn(4, 6, generator=gen, requires_grad=True)
    fixed = torch.randn(4, 6, generator=gen)
    interaction(dense, fixed).sum().backward()
    assert dense.grad is not None and fixed.grad is None


def test_one_operator_under_fx():
    class Top(torch.nn.Module):
        def forward(self, dense, a, b):
            return interaction(dense, a, b)

    traced = torch.fx.symbolic_trace(Top())
    assert [n.target for n in traced.graph.nodes if n.op == "call_function"] == [torch.ops.ember.interaction]


@pytest.mark.skipif(not HAS_COMPILE, reason="torch.compile with fake kernels needs torch >= 2.4")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # inductor's own imports
def test_torch_compile_without_a_break(gen):
    xs = [torch.randn(4, 8, generator=gen, requires_grad=True) for _ in range(3)]
    compiled = torch.compile(lambda *x: interaction(*x).square().sum(), fullgraph=True)
    compiled(*xs).backward()
    expect = torch.autograd.grad(composite(*xs).square().sum(), xs)
    for x, e in zip(xs, expect):
        torch.testing.assert_close(x.grad, e, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not hasattr(torch.library, "opcheck"), reason="torch.library.opcheck needs torch >= 2.4")
def test_opcheck(gen):
    xs = [torch.randn(3, 4, generator=gen, requires_grad=True) for _ in range(3)]
    torch.library.opcheck(torch.ops.ember.interaction.default, (xs,))


def test_bad_input_raises_a_clear_error():
    with pytest.raises(TypeError, match=r"sparse\[0\] must be a torch.Tensor"):
        interaction(torch.ones(2, 3), [torch.ones(2, 3)])
    with pytest.raises(ValueError, match=r"inputs\[1\] must have the shape of inputs\[0\]"):
        interaction(torch.ones(2, 3), torch.ones(2, 4))
    with pytest.raises(TypeError, match="dtype float32"):
        interaction(torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="float32, bfloat16 or float64"):
        interaction(torch.ones(2, 3, dtype=torch.float16))
    with pytest.raises(ValueError, match="2-D"):
        interaction(torch.ones(2, 3, 4))


def test_the_kernel_runs_at_the_expected_level(isa_level):
    level = ember._C.interaction_implementation()
    assert level == ("ref" if isa_level == "ref" else "avx2" if isa_level == "avx2" else "avx512")
