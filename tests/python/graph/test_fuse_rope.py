"""The rotary-embedding pass (ember._optimize.graph.fuse_rope): Hugging Face's rotate-half form, in symbolic-trace and
ATen form and with its operands in either order, onto ember's kernel; a reader of an intermediate value, the
interleaved form or a split that is not the middle keeps torch's ops. Results are compared with the model's own in
fp32, bf16 and under bf16 autocast, for every dtype and layout, and the kernel is seen to run."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch
from graphs import HAS_EXPORT_AUTO, all_passes, close, graph_forward, small_llama
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import ember
from ember import _C
from ember._optimize.graph import rope_node
from ember._optimize.graph.rope_node import FusedRope

D = 16


@pytest.fixture
def kernel_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times the fused nodes call ember's rotary-embedding kernel (counted, then run)."""
    calls = [0]

    def rotary_embedding(*args: Any) -> None:
        calls[0] += 1
        _C.rotary_embedding(*args)

    monkeypatch.setattr(rope_node, "_C", types.SimpleNamespace(rotary_embedding=rotary_embedding))
    return calls


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Hugging Face's, as written there."""
    x1 = x[..., : D // 2]
    x2 = x[..., D // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class ApplyRotary(nn.Module):
    """Hugging Face's apply_rotary_pos_emb: the tables unsqueezed over the heads, queries and keys rotated."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Any:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


class Reordered(nn.Module):
    """The same, every commutative operation's operands the other way round."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Any:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return (sin * rotate_half(q)) + (cos * q), k


class KeepsTheRotation(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Any:
        turned = rotate_half(q)
        return q * cos.unsqueeze(1) + turned * sin.unsqueeze(1), turned


class Interleaved(nn.Module):
    """GPT-J's pairs of adjacent features: another pattern, left to torch."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Any:
        pairs = torch.stack((-q[..., 1::2], q[..., ::2]), dim=-1).flatten(-2)
        return q * cos.unsqueeze(1) + pairs * sin.unsqueeze(1)


class OffCentre(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Any:
        turned = torch.cat((-q[..., 4:], q[..., :4]), dim=-1)
        return q * cos.unsqueeze(1) + turned * sin.unsqueeze(1)


def _inputs(batch: int = 2, heads: int = 3, length: int = 7, dtype: torch.dtype = torch.float32) -> Any:
    """q and k as a projection split into heads gives them ([b, l, h, d] memory), and [b, l, d] tables."""
    q = torch.randn(batch, length, heads, D).transpose(1, 2).to(dtype)
    k = torch.randn(batch, length, heads, D).transpose(1, 2).to(dtype)
    angles = torch.randn(batch, length, D // 2).repeat(1, 1, 2)
    return q, k, angles.cos().to(dtype), angles.sin().to(dtype)


def _outputs(value: Any) -> list[torch.Tensor]:
    return list(value) if isinstance(value, tuple) else [value]


def _check(model: nn.Module, export: bool = False) -> Any:
    model.eval()
    inputs = _inputs()
    with torch.no_grad():
        gm = all_passes(model, inputs, export=export)
        for got, expected in zip(_outputs(gm(*inputs)), _outputs(model(*inputs))):
            assert close(got, expected)
            assert got.stride() == expected.stride() or not got.is_contiguous()
        low = tuple(t.bfloat16() for t in inputs)
        for got, expected in zip(_outputs(gm(*low)), _outputs(model(*low))):
            assert got.dtype == expected.dtype == torch.bfloat16
            assert torch.allclose(got.float(), expected.float(), rtol=2e-2, atol=2e-2)
        mixed = (low[0], low[1], *inputs[2:])  # bf16 queries, fp32 tables: the result is fp32, as torch promotes
        for got, expected in zip(_outputs(gm(*mixed)), _outputs(model(*mixed))):
            assert got.dtype == expected.dtype
            assert torch.allclose(got.float(), expected.float(), rtol=1e-2, atol=1e-2)
    return gm


def _fused(gm: Any) -> list[FusedRope]:
    return [m for m in gm.modules() if isinstance(m, FusedRope)]


def test_queries_and_keys_run_on_the_kernel(kernel_calls: list[int]) -> None:
    torch.manual_seed(0)
    gm = _check(ApplyRotary())
    assert len(_fused(gm)) == 2
    assert kernel_calls[0] == 6  # two a call: fp32, bf16, mixed
    assert not [n for n in gm.graph.nodes if "cat" in str(n.target) or "neg" in str(n.target)]


def test_operands_in_either_order(kernel_calls: list[int]) -> None:
    torch.manual_seed(0)
    gm = _check(Reordered())
    assert len(_fused(gm)) == 1
    assert kernel_calls[0] == 3


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="torch.export with automatic dynamic sizes")
def test_aten_form(kernel_calls: list[int]) -> None:
    torch.manual_seed(0)
    gm = _check(ApplyRotary(), export=True)
    assert len(_fused(gm)) == 2
    assert kernel_calls[0] == 6


@pytest.mark.parametrize("model", [KeepsTheRotation(), Interleaved()], ids=type)
def test_patterns_the_kernel_cannot_take_stay_torch(model: nn.Module) -> None:
    inputs = _inputs()
    model.eval()
    with torch.no_grad():
        gm = all_passes(model, inputs)
        for got, expected in zip(_outputs(gm(*inputs)), _outputs(model(*inputs))):
            assert close(got, expected)
    assert not _fused(gm)


def test_a_split_off_the_middle_never_reaches_the_kernel(kernel_calls: list[int]) -> None:
    """A symbolic trace does not record x's width: the split is checked against it on every call."""
    inputs = _inputs()
    model = OffCentre().eval()
    with torch.no_grad():
        gm = all_passes(model, inputs)
        assert close(gm(*inputs), model(*inputs))
    assert kernel_calls[0] == 0


def test_autograd_runs_the_graphs_own_ops(kernel_calls: list[int]) -> None:
    torch.manual_seed(0)
    model = ApplyRotary().eval()
    q, k, cos, sin = _inputs()
    gm = all_passes(model, (q, k, cos, sin))
    q.requires_grad_(True)
    sum(t.sum() for t in gm(q, k, cos, sin)).backward()
    expected = q.grad.clone()
    q.grad = None
    sum(t.sum() for t in model(q, k, cos, sin)).backward()
    assert close(q.grad, expected)
    assert kernel_calls[0] == 1  # the keys' rotation, which autograd does not need, still ran on the kernel


_DTYPES = st.sampled_from([torch.float32, torch.bfloat16, torch.float64, torch.float16])


@settings(max_examples=30, deadline=None, derandomize=True)  # each example traces a model: no per-example deadline
@given(
    batch=st.integers(0, 2),
    length=st.integers(1, 9),
    x_dtype=_DTYPES,
    table_dtype=_DTYPES,
    contiguous=st.booleans(),
)
def test_any_input_gives_what_the_model_gives(
    batch: int, length: int, x_dtype: torch.dtype, table_dtype: torch.dtype, contiguous: bool
) -> None:
    """Every dtype mix (float64 and float16 fall back), empty batches, either layout: what the model returns."""
    torch.manual_seed(0)
    model = ApplyRotary().eval()
    q, k, cos, sin = _inputs(batch, 2, length)
    q, k, cos, sin = q.to(x_dtype), k.to(x_dtype), cos.to(table_dtype), sin.to(table_dtype)
    if contiguous:
        q, k = q.contiguous(), k.contiguous()
    with torch.no_grad():
        gm = all_passes(model, _inputs())
        try:
            expected = model(q, k, cos, sin)
        except RuntimeError:  # a dtype mix this torch's ops refuse: refused the same way
            with pytest.raises(RuntimeError):
                gm(q, k, cos, sin)
            return
        got = gm(q, k, cos, sin)
    low = {x_dtype, table_dtype} & {torch.float16, torch.bfloat16}
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        assert torch.allclose(g.double(), e.double(), rtol=2e-2 if low else 1e-5, atol=2e-2 if low else 1e-5)


def test_graph_mode_runs_llama_rotations_on_the_kernel(kernel_calls: list[int]) -> None:
    transformers = pytest.importorskip("transformers")
    if not HAS_EXPORT_AUTO:
        pytest.skip("Hugging Face models are captured by torch.export with automatic dynamic sizes")
    model, ids = small_llama(transformers)
    with torch.no_grad():
        expected = model(ids).logits
    optimized = ember.optimize(model, graph_mode=True, sample_input=(ids,))
    kernel_calls[0] = 0
    with torch.no_grad():
        got = optimized(ids).logits
    assert kernel_calls[0] == 4  # queries and keys of two layers
    assert close(got, expected)


@pytest.mark.skipif(not _C.Linear.supported("bfloat16"), reason="ember's bf16 layers need AVX512-BF16 or AMX")
def test_under_bf16_autocast_rotations_only_attention_reads_are_written_in_bf16() -> None:
    """Llama's bf16 query times its fp32 tables is fp32, which autocast's attention converts to bf16 at once: the
    kernel writes bf16 itself where fused attention is the only reader, and the model's result does not move."""
    transformers = pytest.importorskip("transformers")
    if not HAS_EXPORT_AUTO:
        pytest.skip("Hugging Face models are captured by torch.export with automatic dynamic sizes")
    model, ids = small_llama(transformers)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = model(ids).logits.float()
    with torch.no_grad():
        exact = model(ids).logits
    optimized = ember.optimize(model, dtype=torch.bfloat16, graph_mode=True, sample_input=(ids,))
    ropes = [m for m in graph_forward(optimized).graph.modules() if isinstance(m, FusedRope)]
    assert len(ropes) == 4 and all(rope.for_attention for rope in ropes)
    dtypes: list[torch.dtype] = []
    for rope in ropes:
        rope.register_forward_hook(lambda _m, _a, out: dtypes.append(out.dtype))
    with torch.no_grad():
        got = optimized(ids).logits.float()
    assert dtypes == [torch.bfloat16] * 4
    assert (got - exact).abs().max() <= 3 * (autocast - exact).abs().max() + 1e-3 * exact.abs().max()


@pytest.mark.skipif(not hasattr(torch.nn.functional, "scaled_dot_product_attention"), reason="torch >= 2.0")
def test_a_rotation_read_besides_attention_keeps_its_dtype() -> None:
    class Returned(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rotary = ApplyRotary()

        def forward(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Any:
            q, k = self.rotary(q, k, cos, sin)
            return torch.nn.functional.scaled_dot_product_attention(q, k, k), q

    q, k, cos, sin = torch.randn(1, 2, 5, D), torch.randn(1, 2, 5, D), torch.randn(1, 5, D), torch.randn(1, 5, D)
    gm = all_passes(Returned(), (q, k, cos, sin))
    ropes = [m for m in gm.modules() if isinstance(m, FusedRope)]
    assert len(ropes) == 2 and [r.for_attention for r in ropes] == [False, False]
