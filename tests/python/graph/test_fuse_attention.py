"""The attention pass (ember._optimize.graph.fuse_attention): ``F.scaled_dot_product_attention`` (function and ATen
form) and the written-out matmul - scale - mask - softmax - matmul onto ember's flash-attention kernel; a reader of
an intermediate value, a softmax over another dimension or a computed scale keeps torch's ops. Results are compared
with the model's own in fp32 and bf16, and the kernel is seen to run."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from graphs import HAS_EXPORT_AUTO, all_passes, close, fused_attention, graph_forward, small_llama
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import fx, nn

import ember
from ember._optimize.graph import attention_node
from ember._optimize.graph.passes import run_passes
from ember._optimize.graph.refs import TensorOperands

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")
_SDPA_SIGNATURE = (F.scaled_dot_product_attention.__doc__ or "").split("\n", 2)[:2] if HAS_SDPA else []  # a builtin
HAS_SCALE = any("scale=" in line for line in _SDPA_SIGNATURE)  # torch >= 2.1
HAS_GQA = any("enable_gqa" in line for line in _SDPA_SIGNATURE)  # torch >= 2.5
needs_sdpa = pytest.mark.skipif(not HAS_SDPA, reason="F.scaled_dot_product_attention: torch >= 2.0")


class Sdpa(nn.Module):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self.kwargs = kwargs

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, **self.kwargs)


class SdpaMasked(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class WrittenOut(nn.Module):
    """Attention spelled out, as BERT's and GPT-2's eager code (and most hand-written models) spell it."""

    def __init__(self, scaling: str = "div", upcast: bool = False, module_softmax: bool = False) -> None:
        super().__init__()
        self.scaling = scaling
        self.upcast = upcast
        self.softmax = nn.Softmax(dim=-1) if module_softmax else None

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        s = torch.matmul(q, k.transpose(-1, -2))
        if self.scaling == "div":
            s = s / math.sqrt(16)  # a head size the model knows (from its config)
        elif self.scaling == "mul":
            s = s * 0.3
        return s

    def probabilities(self, s: torch.Tensor) -> torch.Tensor:
        if self.softmax is not None:
            return self.softmax(s)
        if self.upcast:
            return F.softmax(s, dim=-1, dtype=torch.float32).to(s.dtype)
        return s.softmax(dim=-1)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.probabilities(self.scores(q, k)) @ v


class WrittenOutMasked(WrittenOut):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.matmul(self.probabilities(self.scores(q, k) + mask), v)


class Batched3d(nn.Module):
    """``[batch * heads, length, features]`` operands through ``bmm``."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.bmm(torch.softmax(torch.bmm(q, k.transpose(1, 2)) * 0.25, dim=-1), v)


class SharedTranspose(WrittenOut):
    """k's transpose read elsewhere too: the node takes the transposed keys."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
        k_t = k.transpose(-2, -1)
        return torch.softmax(q @ k_t * 0.5, dim=-1) @ v, k_t.sum()


class KeepsProbabilities(WrittenOut):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
        p = torch.softmax(self.scores(q, k), dim=-1)
        return p @ v, p


class SoftmaxOverQueries(WrittenOut):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.scores(q, k), dim=-2) @ v


class ComputedScale(WrittenOut):
    def __init__(self) -> None:
        super().__init__()
        self.temperature = nn.Parameter(torch.tensor(0.7))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.softmax(q @ k.transpose(-1, -2) * self.temperature, dim=-1) @ v


def _qkv(batch: int = 2, heads: int = 3, queries: int = 7, keys: int = 9, dim: int = 16, heads_kv: int = 0) -> Any:
    """q, k, v as a projection split into heads gives them: [b, l, h, e] memory seen as [b, h, l, e]."""
    heads_kv = heads_kv or heads
    q = torch.randn(batch, queries, heads, dim).transpose(1, 2)
    k = torch.randn(batch, keys, heads_kv, dim).transpose(1, 2)
    v = torch.randn(batch, keys, heads_kv, dim).transpose(1, 2)
    return q, k, v


def _check(model: nn.Module, inputs: tuple[torch.Tensor, ...], export: bool = False) -> Any:
    """Runs the passes on ``model``, compares with eager in fp32, in bf16 and under bf16 autocast; returns the
    graph."""
    model.eval()
    with torch.no_grad():
        gm = all_passes(model, inputs, export=export)
        assert close(gm(*inputs), model(*inputs))
        low = tuple(t.bfloat16() if t.is_floating_point() else t for t in inputs)
        got, expected = gm(*low), model(*low)
        assert got.dtype == expected.dtype == torch.bfloat16
        _no_worse_than_torchs(got, expected, model, low)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got, expected = gm(*inputs), model(*inputs)
        assert got.dtype == expected.dtype
        _no_worse_than_torchs(got, expected, model, inputs)
    return gm


def _no_worse_than_torchs(got: torch.Tensor, expected: torch.Tensor, model: nn.Module, inputs: Any) -> None:
    """The kernel keeps the scores and probabilities in fp32 where torch's bf16 operations round them: against float64
    on the same inputs, its error is at most torch's own plus one bf16 rounding of the output. (Closeness to torch's
    bf16 result is no measure: unscaled scores of 16 features reach 10 and more, where a bf16 ulp is 1/16, and torch
    1.13's bf16 probabilities stray by a few percent from the true ones.)"""
    reference = model(*(t.double() if t.is_floating_point() else t for t in inputs))
    ours, torchs = ((r.double() - reference).abs().max() for r in (got, expected))
    assert ours <= torchs + 2**-8 * reference.abs().max(), f"ember's error {ours:.3g}, torch's {torchs:.3g}"


@needs_sdpa
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"is_causal": True}, *([{"scale": 0.3}, {"scale": 0.3, "is_causal": True}] if HAS_SCALE else [])],
    ids=str,
)
def test_sdpa_runs_on_the_kernel(kwargs: dict[str, Any], kernel_calls: list[int]) -> None:
    torch.manual_seed(0)
    gm = _check(Sdpa(**kwargs), _qkv())
    [node] = fused_attention(gm)
    assert node.causal == kwargs.get("is_causal", False)
    assert kernel_calls[0] == 3  # fp32, bf16, autocast: no fallback


@needs_sdpa
@pytest.mark.parametrize("mask", ["bool padding", "float full", "bool per head"])
def test_sdpa_masks(mask: str, kernel_calls: list[int]) -> None:
    torch.manual_seed(0)
    q, k, v = _qkv()
    if mask == "bool padding":  # [b, 1, 1, keys], the last keys of the second sequence padded away
        m = torch.ones(2, 1, 1, 9, dtype=torch.bool)
        m[1, ..., 6:] = False
    elif mask == "float full":
        m = torch.randn(2, 1, 7, 9)
    else:
        m = torch.rand(3, 7, 9) > 0.3
        m[..., 0] = True  # no row fully masked (torch's bf16 and fp32 paths differ there, before 2.5)
    gm = _check(SdpaMasked(), (q, k, v, m))
    assert len(fused_attention(gm)) == 1
    assert kernel_calls[0] == 3


@needs_sdpa
def test_a_fully_masked_row_gives_zeros_as_sdpa_does() -> None:
    q, k, v = _qkv(batch=1)
    m = torch.ones(1, 1, 7, 9, dtype=torch.bool)
    m[..., 3, :] = False
    with torch.no_grad():
        gm = all_passes(SdpaMasked().eval(), (q, k, v, m))
        got = gm(q, k, v, m)
    assert torch.equal(got[:, :, 3], torch.zeros_like(got[:, :, 3]))
    assert close(got, F.scaled_dot_product_attention(q, k, v, attn_mask=m))


@needs_sdpa
@pytest.mark.skipif(not HAS_GQA, reason="enable_gqa: torch >= 2.5")
def test_grouped_query_heads(kernel_calls: list[int]) -> None:
    torch.manual_seed(0)
    gm = _check(Sdpa(enable_gqa=True, is_causal=True), _qkv(heads=4, heads_kv=2, queries=9))
    assert fused_attention(gm)[0].grouped
    assert kernel_calls[0] == 3


@needs_sdpa
@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="torch.export with automatic dynamic sizes")
def test_sdpa_in_aten_form(kernel_calls: list[int]) -> None:
    torch.manual_seed(0)
    gm = _check(Sdpa(is_causal=True), _qkv(), export=True)
    assert len(fused_attention(gm)) == 1
    assert kernel_calls[0] == 3


@pytest.mark.parametrize(
    "model",
    [WrittenOut(), WrittenOut("mul"), WrittenOut("none"), WrittenOut(upcast=True), WrittenOut(module_softmax=True)],
    ids=["div", "mul", "unscaled", "fp32 softmax", "softmax module"],
)
def test_written_out_attention_runs_on_the_kernel(model: nn.Module, kernel_calls: list[int]) -> None:
    torch.manual_seed(0)
    gm = _check(model, _qkv())
    [node] = fused_attention(gm)
    assert node.scale == {"div": 0.25, "mul": 0.3, "none": 1.0}[model.scaling]  # type: ignore[index]
    assert not [n for n in gm.graph.nodes if "softmax" in str(n.target).lower()]
    assert kernel_calls[0] == 3


def test_written_out_with_an_additive_mask(kernel_calls: list[int]) -> None:
    """Hugging Face's eager masks: 0 where kept, the dtype's lowest where masked, broadcast over heads."""
    torch.manual_seed(0)
    q, k, v = _qkv()
    mask = torch.zeros(2, 1, 1, 9)
    mask[1, ..., 5:] = torch.finfo(torch.float32).min
    gm = _check(WrittenOutMasked(), (q, k, v, mask))
    assert not fused_attention(gm)[0].bool_mask_keeps
    assert kernel_calls[0] == 3


def test_a_bool_mask_added_as_numbers_stays_torch(kernel_calls: list[int]) -> None:
    """``scores + mask`` with a bool mask adds 1 where True: not the kernel's keep-mask, so torch runs it."""
    q, k, v = _qkv()
    mask = torch.rand(2, 1, 7, 9) > 0.5
    model = WrittenOutMasked().eval()
    with torch.no_grad():
        gm = all_passes(model, (q, k, v, mask))
        assert close(gm(q, k, v, mask), model(q, k, v, mask))
    assert kernel_calls[0] == 0


def test_bmm_over_merged_heads(kernel_calls: list[int]) -> None:
    torch.manual_seed(0)
    q, k, v = (t.reshape(6, t.shape[2], 16) for t in (x.contiguous() for x in _qkv()))
    gm = _check(Batched3d(), (q, k, v))
    assert len(fused_attention(gm)) == 1
    assert kernel_calls[0] == 3


class WrittenOutFilled(WrittenOut):
    """The scores filled where a bool mask is False, as masked_fill spells a padding mask."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.matmul(self.probabilities(self.scores(q, k).masked_fill(~mask, -1e38)), v)


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "nothing filled"])
def test_written_out_with_filled_scores(padded: bool, kernel_calls: list[int]) -> None:
    torch.manual_seed(0)
    q, k, v = _qkv()
    keep = torch.ones(2, 1, 7, 9, dtype=torch.bool)
    if padded:
        keep[1, ..., 5:] = False
        keep[0, :, 2] = False  # a query that sees no key
    gm = _check(WrittenOutFilled(), (q, k, v, keep))
    assert fused_attention(gm)[0].mask_fill == -1e38
    assert kernel_calls[0] == 3


class FilledOverMergedHeads(nn.Module):
    """DeBERTa-v2's attention: q, k and v projected and split into ``[batch * heads, length, 16]`` for ``bmm``, the
    keys' transpose divided by a scale computed from the head size (``torch.tensor(d).sqrt()``), the scores viewed
    as ``[batch, heads, ...]`` and filled with the dtype's lowest value where a bool mask is False, the
    probabilities viewed back."""

    def __init__(self, fill: float | None = None, keep_probabilities: bool = False) -> None:
        super().__init__()
        self.heads = 3
        self.q, self.k, self.v = nn.Linear(48, 48), nn.Linear(48, 48), nn.Linear(48, 48)
        self.fill = fill
        self.keep_probabilities = keep_probabilities

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """DeBERTa's transpose_for_scores: [batch, length, heads * 16] as [batch * heads, length, 16]."""
        x = x.view(x.size(0), x.size(1), self.heads, -1)
        return x.permute(0, 2, 1, 3).contiguous().view(-1, x.size(1), x.size(-1))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> Any:
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        scale = torch.sqrt(torch.tensor(q.size(-1), dtype=torch.float) * 1)
        s = torch.bmm(q, k.transpose(-1, -2) / scale.to(dtype=q.dtype))
        s = s.view(-1, self.heads, s.size(-2), s.size(-1))
        s = s.masked_fill(~mask, torch.finfo(q.dtype).min if self.fill is None else self.fill)
        p = F.softmax(s, dim=-1)
        out = torch.bmm(p.view(-1, p.size(-2), p.size(-1)), v)
        return (out, p) if self.keep_probabilities else out


def _merged_heads_inputs(batch: int = 2, length: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    """Hidden states and DeBERTa's mask (``m_i * m_j`` of a padding mask, [batch, 1, length, length]): the padded
    queries of the second sequence see no key at all."""
    keep = torch.ones(batch, length, dtype=torch.bool)
    keep[1, 6:] = False
    return torch.randn(batch, length, 48), keep[:, None, :, None] & keep[:, None, None, :]


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="torch.export with automatic dynamic sizes")
def test_scores_filled_over_merged_heads_run_on_the_kernel(kernel_calls: list[int]) -> None:
    """In fp32 and in bf16, each exported for its dtype (the graph holds the dtype's lowest value as a number)."""
    torch.manual_seed(0)
    inputs = _merged_heads_inputs()
    model = FilledOverMergedHeads().eval()
    with torch.no_grad():
        gm = all_passes(model, inputs, export=True)
        got = gm(*inputs)
        assert close(got, model(*inputs))
        # a query that sees no key weighs every key alike, as the filled softmax does
        values = model.split(model.v(inputs[0])).view(2, 3, 9, 16)
        assert close(got.view(2, 3, 9, 16)[1, :, 7], values[1].mean(dim=1))
        [node] = fused_attention(gm)
        assert (node.heads, node.scale, node.mask_fill) == (3, 0.25, torch.finfo(torch.float32).min)
        low = tuple(t.bfloat16() if t.is_floating_point() else t for t in inputs)
        model_low = copy.deepcopy(model).bfloat16()
        gm = all_passes(model_low, low, compute=torch.bfloat16, export=True)
        got, expected = gm(*low), model_low(*low)
        assert got.dtype == expected.dtype == torch.bfloat16
        _no_worse_than_torchs(got, expected, copy.deepcopy(model_low).double(), low)
        assert fused_attention(gm)[0].mask_fill == torch.finfo(torch.bfloat16).min
    assert kernel_calls[0] == 2


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="torch.export with automatic dynamic sizes")
@pytest.mark.parametrize("model", [FilledOverMergedHeads(fill=-1e4), FilledOverMergedHeads(keep_probabilities=True)],
                         ids=["a fill the kernel cannot add", "the probabilities kept"])  # fmt: skip
def test_filled_scores_the_kernel_cannot_take_stay_torch(model: nn.Module, kernel_calls: list[int]) -> None:
    """-1e4 added to a score is not -1e4 (a row filled throughout would weigh its keys by their scores)."""
    inputs = _merged_heads_inputs()
    with torch.no_grad():
        gm = all_passes(model.eval(), inputs, export=True)
        got, expected = gm(*inputs), model(*inputs)
    assert not fused_attention(gm) and kernel_calls[0] == 0
    pairs = zip(got if isinstance(got, tuple) else (got,), expected if isinstance(expected, tuple) else (expected,))
    assert all(close(g, e) for g, e in pairs)


def test_a_transpose_read_elsewhere_is_passed_as_it_is(kernel_calls: list[int]) -> None:
    torch.manual_seed(0)
    model = SharedTranspose().eval()
    inputs = _qkv()
    with torch.no_grad():
        gm = all_passes(model, inputs)
        for got, expected in zip(gm(*inputs), model(*inputs)):
            assert close(got, expected)
    [node] = fused_attention(gm)
    assert node.keys_transposed
    assert kernel_calls[0] == 1


class ContiguousHeads(nn.Module):
    """Whisper's and BART's heads: each projection viewed as [b, l, h, e], transposed and made contiguous before SDPA;
    with ``keep``, the contiguous queries are returned too (read elsewhere)."""

    def __init__(self, keep: bool = False) -> None:
        super().__init__()
        self.keep = keep

    def forward(self, x: torch.Tensor) -> Any:
        b, n = x.shape[0], x.shape[1]
        q, k, v = ((x * c).view(b, n, 2, 8).transpose(1, 2).contiguous() for c in (1.0, 0.5, 2.0))
        out = F.scaled_dot_product_attention(q, k, v)
        return (out, q) if self.keep else out


@needs_sdpa
@pytest.mark.parametrize(
    "export",
    [
        pytest.param(False, id="traced"),
        pytest.param(True, id="exported", marks=pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="no Dim.AUTO")),
    ],
)
def test_contiguous_copies_only_the_kernel_reads_are_dropped(export: bool, kernel_calls: list[int]) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    for keep, copies in ((False, 0), (True, 1)):
        model = ContiguousHeads(keep).eval()
        with torch.no_grad():
            gm = all_passes(model, (x,), export=export)
            targets = [str(n.target) for n in gm.graph.nodes]
            assert sum("contiguous" in t for t in targets) == copies
            for got, expected in zip(gm(x) if keep else [gm(x)], model(x) if keep else [model(x)]):
                assert close(got, expected)
    assert kernel_calls[0] == 2
    x.requires_grad_(True)
    gm(x)[0].sum().backward()  # the graph's own ops (autograd) read the strided heads as SDPA does
    assert x.grad is not None


@pytest.mark.parametrize("model", [KeepsProbabilities(), SoftmaxOverQueries(), ComputedScale()], ids=type)
def test_patterns_the_kernel_cannot_take_stay_torch(model: nn.Module) -> None:
    inputs = _qkv()
    model.eval()
    with torch.no_grad():
        gm = all_passes(model, inputs)
        got, expected = gm(*inputs), model(*inputs)
    assert not fused_attention(gm)
    for g, e in zip(
        got if isinstance(got, tuple) else (got,), expected if isinstance(expected, tuple) else (expected,)
    ):
        assert close(g, e)


@needs_sdpa
def test_dropout_in_the_call_stays_torch() -> None:
    model = Sdpa(dropout_p=0.1).eval()  # (SDPA drops out whatever the mode; ember's capture refuses the model)
    gm = fx.symbolic_trace(model)
    run_passes(gm, TensorOperands(model, gm), torch.float32, replay=False)
    assert not fused_attention(gm)


def test_autograd_runs_the_graphs_own_ops(kernel_calls: list[int]) -> None:
    torch.manual_seed(0)
    model = WrittenOut().eval()
    q, k, v = _qkv()
    gm = all_passes(model, (q, k, v))
    q.requires_grad_(True)
    gm(q, k, v).sum().backward()
    expected = q.grad.clone()
    q.grad = None
    model(q, k, v).sum().backward()
    assert kernel_calls[0] == 0
    assert close(q.grad, expected)


_DTYPES = st.sampled_from([torch.float32, torch.bfloat16, torch.float64, torch.float16])


@settings(max_examples=40, deadline=None, derandomize=True)  # each example traces a model: no per-example deadline
@given(
    sdpa=st.booleans() if HAS_SDPA else st.just(False),
    batch=st.integers(1, 2),
    heads=st.integers(1, 3),
    queries=st.integers(1, 70),
    keys=st.integers(1, 70),
    dim=st.integers(1, 40),
    dtype=_DTYPES,
    mask=st.sampled_from(["none", "padding", "full", "broadcast batch"]),
    causal=st.booleans(),
    contiguous=st.booleans(),
)
def test_any_input_gives_what_the_model_gives(
    sdpa: bool, batch: int, heads: int, queries: int, keys: int, dim: int, dtype: torch.dtype, mask: str,
    causal: bool, contiguous: bool,
) -> None:  # fmt: skip
    """Shapes with tails of every block size, every dtype (float64 and float16 fall back), masks of every
    broadcast, causal (SDPA), either layout: the fused graph returns what the model returns, in its dtype."""
    torch.manual_seed(0)
    q, k, v = (t.to(dtype) for t in _qkv(batch, heads, queries, keys, dim))
    if contiguous:
        q, k, v = (t.contiguous() for t in (q, k, v))
    shapes = {"padding": (batch, 1, 1, keys), "full": (batch, heads, queries, keys), "broadcast batch": (queries, keys)}
    m = None if mask == "none" else torch.randn(shapes[mask]).to(dtype)
    if sdpa:
        model: nn.Module = Sdpa(is_causal=causal) if m is None else SdpaMasked()
    else:
        model = WrittenOut() if m is None else WrittenOutMasked()
    inputs = (q, k, v) if m is None else (q, k, v, m)
    model.eval()
    with torch.no_grad():
        gm = all_passes(model, _qkv(2, 3, 5, 6, 8) + (() if m is None else (torch.randn(2, 1, 1, 6),)))
        try:
            expected = model(*inputs)
        except RuntimeError:  # a dtype this torch's matmul refuses (torch 1.13: float16): refused the same way
            with pytest.raises(RuntimeError):
                gm(*inputs)
            return
        got = gm(*inputs)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    low = dtype in (torch.float16, torch.bfloat16)
    assert torch.allclose(got.double(), expected.double(), rtol=2e-2 if low else 1e-5, atol=2e-2 if low else 1e-5)


def repeat_kv(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Hugging Face's, as written there."""
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


class RepeatedHeads(nn.Module):
    """Grouped-query attention as Hugging Face's SDPA path spells it: key/value heads repeated, then SDPA."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, repeat_kv(k, 2), repeat_kv(v, 2), is_causal=True)


@needs_sdpa
@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="torch.export with automatic dynamic sizes")
def test_repeated_key_value_heads_are_read_as_groups(kernel_calls: list[int]) -> None:
    """The repeat (expand + reshape, a copy of every key and value) leaves the graph: the kernel reads the groups."""
    torch.manual_seed(0)
    model = RepeatedHeads().eval()
    gm = _check(model, _qkv(heads=4, heads_kv=2, queries=9, keys=9), export=True)
    [node] = fused_attention(gm)
    assert node.grouped and node.repeats_heads
    assert not [n for n in gm.graph.nodes if "expand" in str(n.target) or "reshape" in str(n.target)]
    assert kernel_calls[0] == 3
    q, k, v = _qkv(heads=4, heads_kv=2, queries=9, keys=9)
    q.requires_grad_(True)  # autograd: the graph's own repeat and SDPA
    gm(q, k, v).sum().backward()
    expected = q.grad.clone()
    q.grad = None
    model(q, k, v).sum().backward()
    assert close(q.grad, expected)


def test_graph_mode_runs_llama_attention_on_the_kernel(kernel_calls: list[int]) -> None:
    """Through ``ember.optimize``: a small Llama with grouped key/value heads, in bf16."""
    transformers = pytest.importorskip("transformers")
    if not HAS_SDPA:
        pytest.skip("Hugging Face's attention is written out before torch 2.0 (its eager path)")
    model, ids = small_llama(transformers)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(ids).logits
    optimized = ember.optimize(model, dtype=torch.bfloat16, graph_mode=True, sample_input=(ids,))
    kernel_calls[0] = 0
    with torch.no_grad():
        got = optimized(ids).logits
    assert kernel_calls[0] == 2  # one per layer
    if HAS_EXPORT_AUTO:  # Hugging Face's repeat of the key/value heads is read as groups
        nodes = [m for m in graph_forward(optimized).graph.modules() if isinstance(m, attention_node.FusedAttention)]
        assert nodes and all(n.repeats_heads for n in nodes)
    assert got.dtype == expected.dtype
    assert torch.allclose(got.float(), expected.float(), atol=3e-2, rtol=3e-2)


def test_graph_mode_runs_deberta_attention_on_the_kernel(kernel_calls: list[int]) -> None:
    """Through ``ember.optimize``: a small DeBERTa-v2 with a padded sequence, in fp32 and bf16."""
    transformers = pytest.importorskip("transformers")
    if not HAS_EXPORT_AUTO:
        pytest.skip("DeBERTa's scale is computed from a size: the pattern is read in torch.export's graph")
    config = transformers.DebertaV2Config(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
    )
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (2, 11))
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[1, 7:] = 0
    for dtype in (torch.float32, torch.bfloat16):
        model = transformers.DebertaV2Model(config).eval()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
        sample = {"input_ids": ids, "attention_mask": mask}
        optimized = ember.optimize(model, dtype=dtype, graph_mode=True, sample_input=sample)
        kernel_calls[0] = 0
        with torch.no_grad():
            got = optimized(input_ids=ids, attention_mask=mask).last_hidden_state
        assert kernel_calls[0] == 2  # one per layer
        tolerance = 1e-5 if dtype == torch.float32 else 3e-2
        assert torch.allclose(got.float(), expected.float(), atol=tolerance, rtol=tolerance)


@pytest.mark.skipif(not hasattr(torch, "compile") or not HAS_SDPA, reason="torch.compile: torch >= 2.0")
def test_the_dynamo_backend_fuses_attention(kernel_calls: list[int]) -> None:
    torch.manual_seed(0)
    model = Sdpa(is_causal=True).eval()
    q, k, v = _qkv()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="ember")
    with torch.no_grad():
        got, expected = compiled(q, k, v), model(q, k, v)
    assert kernel_calls[0] == 1
    assert close(got, expected)
    torch._dynamo.reset()


class ScaledQueries(nn.Module):
    """torchvision's Swin scales the queries, not the scores: ``(q * c) @ k^T``."""

    def __init__(self, read_elsewhere: bool = False) -> None:
        super().__init__()
        self.read_elsewhere = read_elsewhere

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scaled = q * 0.25
        out = (scaled @ k.transpose(-2, -1)).softmax(dim=-1) @ v
        return out + scaled.sum() if self.read_elsewhere else out


@pytest.mark.parametrize("read_elsewhere", [False, True])
def test_a_scaling_of_the_queries_is_taken_into_the_kernel(read_elsewhere: bool, kernel_calls: list[int]) -> None:
    torch.manual_seed(0)
    q, k, v = _qkv(queries=9)
    gm = _check(ScaledQueries(read_elsewhere), (q, k, v))
    [node] = fused_attention(gm)
    if read_elsewhere:  # the scaled queries are a value the graph reads: computed, and passed as they are
        assert node.query_scale is None and node.scale == 1.0
    else:  # passed unscaled, the factor in the kernel's scale (the graph's own operations get them scaled)
        assert node.query_scale == 0.25 and node.scale == 1.0
        assert not [n for n in gm.graph.nodes if n.op == "call_function" and "mul" in str(n.target)]
    assert kernel_calls[0] == 3
