"""The norm pass (ember._optimize.graph.fuse_norm): LayerNorm and RMSNorm in every spelling (module, function,
ATen, the hand-written mean/rsqrt forms of Hugging Face's Llama and T5), with the residual add before them, onto
ember's row-norm kernel; a user of an intermediate value, or a weight computed in the forward, keeps torch's ops.
Results are compared with the model's own in fp32 and under bf16 autocast, and the kernel is seen to run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from graphs import HAS_EXPORT_AUTO, all_passes, close, count_calls, fused_norms, outputs, small_llama
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import ember
from ember import _C
from ember._optimize.graph import norm_node

D = 24


class LlamaStyleRMSNorm(nn.Module):
    """Hugging Face's LlamaRMSNorm, as written there (Mistral's and Qwen2's are the same)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class T5StyleNorm(nn.Module):
    """Hugging Face's T5LayerNorm: the squares in fp32, the input itself scaled."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + 1e-6)
        return self.weight * hidden_states


class Unweighted(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5)


class Functional(nn.Module):
    def __init__(self, rms: bool) -> None:
        super().__init__()
        self.rms = rms
        self.weight = nn.Parameter(torch.randn(D))
        self.bias = nn.Parameter(torch.randn(D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rms:
            return F.rms_norm(x, (D,), self.weight)  # type: ignore[attr-defined]  # eps None: the dtype's epsilon
        return F.layer_norm(x, (D,), self.weight, self.bias, 1e-6)


def _affine(norm: nn.Module) -> nn.Module:
    """Random affine parameters, so a swapped weight and bias would show."""
    with torch.no_grad():
        for p in norm.parameters():
            p.copy_(torch.randn_like(p))
    return norm


HAS_RMS = hasattr(F, "rms_norm")
NORMS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "LayerNorm module": (lambda: _affine(nn.LayerNorm(D)), (D,)),
    "LayerNorm without affine": (lambda: nn.LayerNorm(D, elementwise_affine=False), (D,)),
    "LayerNorm over two dimensions": (lambda: _affine(nn.LayerNorm((3, D))), (3, D)),
    "layer_norm function": (lambda: Functional(rms=False), (D,)),
    "Llama RMSNorm": (lambda: LlamaStyleRMSNorm(D), (D,)),
    "T5 norm": (lambda: T5StyleNorm(D), (D,)),
    "unweighted, x * x": (Unweighted, (D,)),
}
if HAS_RMS:
    NORMS["RMSNorm module"] = (lambda: _affine(nn.RMSNorm(D, eps=1e-5)), (D,))  # type: ignore[attr-defined]
    NORMS["rms_norm function"] = (lambda: Functional(rms=True), (D,))


class AddThenNorm(nn.Module):
    """``norm(x + residual)``; with ``keep``, the sum is read again after the norm (a pre-norm block)."""

    def __init__(self, norm: nn.Module, keep: bool) -> None:
        super().__init__()
        self.norm = norm
        self.keep = keep

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> Any:
        h = x + residual
        y = self.norm(h)
        return (y, h * 2) if self.keep else y


@pytest.fixture
def kernel_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times the fused nodes call ember's row-norm kernel (counted, then run)."""
    return count_calls(monkeypatch, norm_node, "row_norm")


def _outputs(value: Any) -> list[torch.Tensor]:
    return list(value) if isinstance(value, tuple) else [value]


def _bf16_expected(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[list[torch.Tensor], bool]:
    """The model's outputs under bf16 autocast, and whether they are its own: where this torch refuses the model's
    norm a bf16 input beside fp32 weights (torch 1.13), what newer torch computes there, the model's fp32 outputs on
    the same values (their dtypes are then not compared)."""
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return _outputs(model(*inputs)), True
    except RuntimeError:
        return _outputs(model(*(t.float() for t in inputs))), False


def _check(model: nn.Module, inputs: tuple[torch.Tensor, ...], export: bool = False) -> Any:
    """Runs the passes on ``model``, compares with eager in fp32 and under bf16 autocast; returns the graph."""
    model.eval()
    with torch.no_grad():
        gm = all_passes(model, inputs, export=export)
        for got, expected in zip(_outputs(gm(*inputs)), _outputs(model(*inputs))):
            assert close(got, expected), (got - expected).abs().max()
        bf16_inputs = tuple(t.bfloat16() for t in inputs)
        expected_bf16, own = _bf16_expected(model, bf16_inputs)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            try:
                results = _outputs(gm(*bf16_inputs))
            except RuntimeError:
                assert not own and not fused_norms(gm)  # torch's own norm, refusing as in eager
                return gm
            for got, expected in zip(results, expected_bf16):
                # One bf16 rounding of a value of magnitude ~|weight| * 3 (the kernel rounds once, torch up to twice)
                assert not own or got.dtype == expected.dtype
                assert torch.allclose(got.float(), expected.float(), rtol=2e-2, atol=5e-2)
    return gm


# torch's rms_norm says so when a bf16 input meets an fp32 weight (the eager reference's call)
_MIXED_RMS = "ignore:Mismatch dtype between input and weight:UserWarning"


@pytest.mark.filterwarnings(_MIXED_RMS)
@pytest.mark.parametrize("name", NORMS)
def test_each_spelling_runs_on_the_kernel(name: str, kernel_calls: list[int]) -> None:
    torch.manual_seed(0)
    make, shape = NORMS[name]
    gm = _check(make(), (torch.randn(2, 5, *shape) * 3 + 1,))
    [norm] = fused_norms(gm)
    assert not norm.adds_residual
    assert kernel_calls[0] == 2  # fp32 and bf16: no fallback


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="torch.export with automatic dynamic sizes")
@pytest.mark.parametrize("name", ["LayerNorm module", "Llama RMSNorm", "T5 norm"])
def test_each_spelling_in_aten_form(name: str, kernel_calls: list[int]) -> None:
    torch.manual_seed(0)
    make, shape = NORMS[name]
    gm = _check(make(), (torch.randn(2, 5, *shape),), export=True)
    assert len(fused_norms(gm)) == 1
    assert kernel_calls[0] == 2


@pytest.mark.parametrize("name", ["LayerNorm module", "Llama RMSNorm", "layer_norm function"])
@pytest.mark.parametrize("keep", [False, True])
def test_the_residual_add_joins_the_norm(name: str, keep: bool, kernel_calls: list[int]) -> None:
    torch.manual_seed(0)
    x, residual = torch.randn(3, 4, D), torch.randn(3, 4, D)
    gm = _check(AddThenNorm(NORMS[name][0](), keep), (x, residual))
    [norm] = fused_norms(gm)
    assert norm.adds_residual and norm.returns_sum == keep
    assert not [n for n in gm.graph.nodes if n.op == "call_function" and "add" in str(n.target)]
    assert kernel_calls[0] == 2


class ParameterAddThenNorm(nn.Module):
    """``norm(x + position)``: a parameter broadcast over the batch is no residual (the norm alone is fused)."""

    def __init__(self) -> None:
        super().__init__()
        self.position = nn.Parameter(torch.randn(1, 4, D))
        self.norm = _affine(nn.LayerNorm(D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.position)


def test_a_parameter_added_before_the_norm_stays_an_add() -> None:
    torch.manual_seed(0)
    gm = _check(ParameterAddThenNorm(), (torch.randn(3, 4, D),))
    [norm] = fused_norms(gm)
    assert not norm.adds_residual


class ReadsTheVariance(nn.Module):
    def forward(self, x: torch.Tensor) -> Any:
        variance = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(variance + 1e-6), variance


class ReadsTheNormalized(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(D))

    def forward(self, x: torch.Tensor) -> Any:
        normalized = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * normalized, normalized.sum()


class ComputedWeight(nn.Module):
    """A weight computed from the model's tensors alone (Gemma's ``1 + weight``): the folding pass keeps it."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (D,), self.weight * 2)


class WeightReadsTheInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (D,), self.weight * x.mean())


class MeanOverAnotherDimension(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + 1e-6)


def test_a_weight_computed_from_the_models_tensors_is_folded_and_the_norm_fused() -> None:
    torch.manual_seed(0)
    gm = _check(ComputedWeight(), (torch.randn(2, 5, D),))
    assert len(fused_norms(gm)) == 1


@pytest.mark.parametrize("model", [ReadsTheVariance, WeightReadsTheInput, MeanOverAnotherDimension])
def test_patterns_the_kernel_cannot_take_stay_torch(model: type[nn.Module]) -> None:
    torch.manual_seed(0)
    gm = _check(model(), (torch.randn(2, 5, D),))
    assert fused_norms(gm) == []


def test_a_user_of_the_normalized_value_stops_the_norm_before_the_weight() -> None:
    torch.manual_seed(0)
    gm = _check(ReadsTheNormalized(), (torch.randn(2, 5, D),))
    [norm] = fused_norms(gm)
    assert norm.refs == (None, None)  # the weight's multiply stays torch's, after the fused norm


def test_autograd_runs_the_graphs_own_ops() -> None:
    torch.manual_seed(0)
    model = AddThenNorm(LlamaStyleRMSNorm(D), keep=True).eval()
    gm = all_passes(model, (torch.randn(2, 3, D), torch.randn(2, 3, D)))
    assert len(fused_norms(gm)) == 1
    x = torch.randn(2, 3, D, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    residual = torch.randn(2, 3, D)
    y, h = gm(x, residual)
    (y.sum() + h.sum()).backward()
    y_ref, h_ref = model(x_ref, residual)
    (y_ref.sum() + h_ref.sum()).backward()
    assert x.grad is not None and x_ref.grad is not None
    assert torch.allclose(x.grad, x_ref.grad, atol=1e-5)


_ODD_DTYPES = st.sampled_from([torch.float32, torch.bfloat16, torch.float64, torch.float16])


@pytest.mark.filterwarnings(_MIXED_RMS)
@settings(max_examples=40, deadline=None, derandomize=True)  # each example traces a model: no per-example deadline
@given(
    name=st.sampled_from(sorted(NORMS)),
    rows=st.lists(st.integers(0, 4), min_size=0, max_size=2),
    x_dtype=_ODD_DTYPES,
    residual_dtype=_ODD_DTYPES,
    transposed=st.booleans(),
    broadcast=st.booleans(),
)
def test_any_input_gives_what_the_model_gives(
    name: str, rows: list[int], x_dtype: torch.dtype, residual_dtype: torch.dtype, transposed: bool, broadcast: bool
) -> None:
    """Odd dtypes (float64 and float16 fall back), empty and 1-row shapes, non-contiguous and broadcast residuals:
    the fused graph returns what the model returns, in the model's dtype."""
    torch.manual_seed(0)
    make, shape = NORMS[name]
    model = AddThenNorm(make(), keep=True).eval()
    sample = (torch.randn(2, 3, *shape), torch.randn(2, 3, *shape))
    with torch.no_grad():
        gm = all_passes(model, sample)
        x = torch.randn(*rows, *shape).to(x_dtype)
        residual = torch.randn(*rows, *shape).to(residual_dtype)
        if transposed and x.dim() >= 2:
            x = x.transpose(0, -1).contiguous().transpose(0, -1)
        if broadcast:
            residual = residual[..., :1, :].expand_as(residual) if residual.dim() >= 2 else residual
        try:
            expected = model(x, residual)
        except RuntimeError:  # a mix of dtypes this torch's ops refuse (torch 1.13: bf16 beside fp32 weights)
            try:
                got = gm(x, residual)
            except RuntimeError:
                return  # refused the same way
            # taken by ember's kernel: what newer torch gives, the fp32 result in the input's dtype
            expected = tuple(t.to(g.dtype) for t, g in zip(model(x.float(), residual.float()), got))
        got = gm(x, residual)
    low = torch.float16 in (x_dtype, residual_dtype) or torch.bfloat16 in (x_dtype, residual_dtype)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        assert torch.allclose(g.double(), e.double(), rtol=2e-2 if low else 1e-5, atol=5e-2 if low else 1e-5)


def test_graph_mode_runs_llama_norms_on_the_kernel(kernel_calls: list[int]) -> None:
    """Through ``ember.optimize``: every norm of a small Llama-shaped decoder block stack, in bf16."""
    transformers = pytest.importorskip("transformers")
    model, ids = small_llama(transformers)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(ids).logits
    optimized = ember.optimize(model, dtype=torch.bfloat16, graph_mode=True, sample_input=(ids,))
    kernel_calls[0] = 0
    with torch.no_grad():
        got = optimized(ids).logits
    assert kernel_calls[0] == 5  # two per layer and the final norm
    assert got.dtype == expected.dtype
    assert torch.allclose(got.float(), expected.float(), atol=3e-2, rtol=3e-2)


class NormThenProjections(nn.Module):
    """A transformer block's entry: a norm whose result three projections read, and the residual add after them."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = _affine(nn.LayerNorm(D))
        self.q, self.k, self.v = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return self.q(h) - self.k(h) + self.v(h) + h


def _in_bf16(model: nn.Module) -> tuple[nn.Module, torch.Tensor, Any, Any]:
    """The model in eval mode (seeded), an input, its graph after the passes for bf16 compute, and its one norm."""
    torch.manual_seed(0)
    model = model.eval()
    x = torch.randn(2, 5, D)
    gm = all_passes(model, x, compute=torch.bfloat16)
    [norm] = fused_norms(gm)
    return model, x, gm, norm


def _norm_node(gm: Any) -> Any:
    [node] = [n for n in gm.graph.nodes if n.op == "call_module" and n.target.startswith("ember_fusednorm")]
    return node


@pytest.mark.skipif(not _C.Linear.supported("bfloat16"), reason="ember's bf16 Linear needs AVX512-BF16 or AMX")
def test_bf16_layers_read_one_bf16_copy_the_norm_writes(kernel_calls: list[int]) -> None:
    model, x, gm, norm = _in_bf16(NormThenProjections())
    assert norm.bf16_copy
    readers = {str(u.target) for getitem in _norm_node(gm).users if getitem.args[1] == 1 for u in getitem.users}
    # q and k (merged into one GEMM) and v (its residual add fused in, so apart) read the copy; the residual add
    # reads the fp32 result
    assert len(readers) == 2 and any("merged" in r for r in readers)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got, expected = gm(x), model(x)
        assert kernel_calls[0] == 1
    assert got.dtype == expected.dtype
    assert torch.allclose(got.float(), expected.float(), rtol=2e-2, atol=5e-2)
    # Under autograd the graph's own norm runs, and the copy is its result rounded
    x.requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = gm(x)
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


class NormReadByProjectionsAlone(nn.Module):
    """A pre-norm block's entry: the norm's result read by the projections alone (the residual is the input)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = _affine(nn.LayerNorm(D))
        self.q, self.k = nn.Linear(D, D), nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return self.q(h) * self.k(h) + x


@pytest.mark.skipif(not _C.Linear.supported("bfloat16"), reason="ember's bf16 Linear needs AVX512-BF16 or AMX")
def test_a_result_only_bf16_layers_read_is_written_in_bf16_alone(kernel_calls: list[int]) -> None:
    model, x, gm, norm = _in_bf16(NormReadByProjectionsAlone())
    assert norm.bf16_copy and not norm.result_read
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        result, copy = norm(x)
        assert copy.dtype == torch.bfloat16 and result is copy  # one bf16 tensor written, no fp32 result
        weight, bias = (r.get().double() for r in norm.refs)
        reference = F.layer_norm(x.double(), (D,), weight, bias).float()
        assert torch.allclose(copy.float(), reference, rtol=2**-8, atol=1e-5)  # one rounding to bf16
        got, expected = gm(x), model(x)
    assert kernel_calls[0] == 2
    assert got.dtype == expected.dtype
    assert torch.allclose(got.float(), expected.float(), rtol=2e-2, atol=5e-2)


def test_fp32_layers_get_no_copy() -> None:
    torch.manual_seed(0)
    gm = all_passes(NormThenProjections().eval(), torch.randn(2, 5, D))
    [norm] = fused_norms(gm)
    assert not norm.bf16_copy and norm.outputs == 0


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile: torch >= 2.0")
@pytest.mark.parametrize("name", ["LayerNorm module", "Llama RMSNorm"])
def test_the_dynamo_backend_fuses_norms(name: str, kernel_calls: list[int]) -> None:
    """Through ``torch.compile(backend="ember")``: the weight is a graph input, passed to the fused node."""
    torch.manual_seed(0)
    model = AddThenNorm(NORMS[name][0](), keep=True).eval()
    x, residual = torch.randn(2, 3, D), torch.randn(2, 3, D)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="ember")
    with torch.no_grad():
        got, expected = compiled(x, residual), model(x, residual)
    assert kernel_calls[0] == 1
    for g, e in zip(got, expected):
        assert close(g, e)
    torch._dynamo.reset()


class NormThenFlattenedProjection(nn.Module):
    """Hugging Face's Conv1D after a norm: the rows flattened for the GEMM, restored after; ``also_returned``
    reads the flattened rows besides the layer."""

    def __init__(self, also_returned: bool) -> None:
        super().__init__()
        self.norm = _affine(nn.LayerNorm(D))
        self.fc = nn.Linear(D, D)
        self.also_returned = also_returned

    def forward(self, x: torch.Tensor) -> Any:
        rows = self.norm(x).view(-1, D)
        out = self.fc(rows).view(x.shape)
        return (out, rows) if self.also_returned else out


@pytest.mark.skipif(not _C.Linear.supported("bfloat16"), reason="ember's bf16 Linear needs AVX512-BF16 or AMX")
@pytest.mark.parametrize("also_returned", [False, True])
def test_a_reshape_that_only_bf16_layers_read_reads_the_bf16_copy(also_returned: bool) -> None:
    torch.manual_seed(0)
    model = NormThenFlattenedProjection(also_returned).eval()
    x = torch.randn(2, 5, D)
    gm = all_passes(model, x, compute=torch.bfloat16)
    [norm] = fused_norms(gm)
    assert norm.bf16_copy is not also_returned
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for got, expected in zip(outputs(gm(x)), outputs(model(x))):
            assert got.dtype == expected.dtype
            assert torch.allclose(got.float(), expected.float(), rtol=2e-2, atol=2e-2)
