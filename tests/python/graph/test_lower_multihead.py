"""``nn.MultiheadAttention`` calls onto ember's kernels (ember._optimize.graph.lower_multihead): torchvision's way of
calling it (self-attention, batch-first, no masks, no weights returned) is written out in the graph, its input
projection, attention and output projection (with the residual add after it) on ember's kernels, in fp32 to 1e-5 of
torch and in bf16 within autocast's error; dynamo's functional form gets a node of its own; every other call runs
the module itself; configurations the node does not run are not lowered."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from graphs import all_passes, close
from torch import nn

from ember import _C
from ember._optimize.graph import attention_node, multihead_node
from ember._optimize.graph.attention_node import FusedAttention
from ember._optimize.graph.multihead_node import FusedMultiheadAttention
from ember._optimize.graph.nodes import FusedLinear


class Encoder(nn.Module):
    """A ViT encoder block, as torchvision writes it."""

    def __init__(self, batch_first: bool = True, need_weights: bool = False, cross: bool = False) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(32)
        self.attention = nn.MultiheadAttention(32, 4, batch_first=batch_first)
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
        self.need_weights = need_weights
        self.cross = cross

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln(x)
        context = x if self.cross else y
        # ([0] where torchvision unpacks: torch 1.13's symbolic trace cannot unpack a call's result on Python 3.11)
        y = self.attention(y, context, context, need_weights=self.need_weights)[0]
        x = x + y
        return x + self.mlp(x)


@pytest.fixture
def attention_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    kernel = _C.scaled_dot_product_attention

    def counted(*args: object) -> None:
        calls[0] += 1
        kernel(*args)

    monkeypatch.setattr(multihead_node._C, "scaled_dot_product_attention", counted)
    monkeypatch.setattr(attention_node._C, "scaled_dot_product_attention", counted)
    return calls


def _fused(gm: torch.nn.Module) -> list[FusedMultiheadAttention]:
    return [m for m in gm.modules() if isinstance(m, FusedMultiheadAttention)]


def test_self_attention_is_written_out_onto_the_kernels_in_fp32(attention_calls: list[int]) -> None:
    torch.manual_seed(0)
    model = Encoder().eval()
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        gm = all_passes(model, x)
        assert not _fused(gm) and not any(n.op == "call_module" and n.target == "attention" for n in gm.graph.nodes)
        assert len([m for m in gm.modules() if isinstance(m, FusedAttention)]) == 1
        # the projections, then the MLP's two Linears: the residual add after the output projection in its epilogue
        linears = [m for m in gm.modules() if isinstance(m, FusedLinear)]
        assert len(linears) == 4 and linears[1].entries == ("add",)
        attention_calls[0] = 0
        assert close(gm(x), model(x))
        assert attention_calls[0] == 1
        for other in (torch.randn(3, 11, 32), torch.randn(6, 32)):  # other sizes, and an unbatched sequence
            assert close(gm(other), model(other))


def test_weights_or_masks_given_as_values_get_the_checking_node(attention_calls: list[int]) -> None:
    """A call whose arguments the graph cannot tell (here ``need_weights`` an input of the forward) is the node that
    checks each call: the kernels where it is plain self-attention, the module otherwise."""

    class Switched(Encoder):
        def forward(self, x: torch.Tensor, weights: bool) -> torch.Tensor:  # type: ignore[override]
            y = self.ln(x)
            return x + self.attention(y, y, y, need_weights=weights)[0]

    torch.manual_seed(0)
    model = Switched().eval()
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        gm = all_passes(model, (x, True))
        assert len(_fused(gm)) == 1
        for weights, calls in ((False, 1), (True, 0)):
            attention_calls[0] = 0
            assert close(gm(x, weights), model(x, weights))
            assert attention_calls[0] == calls


@pytest.mark.skipif(not _C.Linear.supported("bfloat16"), reason="ember's bf16 Linear needs AVX512-BF16 or AMX")
@pytest.mark.skipif(torch.__version__ < "2", reason="torch 1.13's own MultiheadAttention fails under bf16 autocast")
def test_bf16_is_within_autocasts_error(attention_calls: list[int]) -> None:
    torch.manual_seed(0)
    model = Encoder().eval()
    x = torch.randn(2, 9, 32)
    with torch.no_grad():
        gm = all_passes(model, x, compute=torch.bfloat16)
    _check_bf16(gm, model, x, attention_calls)


def _check_bf16(
    run: Callable[[torch.Tensor], torch.Tensor], model: nn.Module, x: torch.Tensor, calls: list[int]
) -> None:
    """``run(x)`` under bf16 autocast calls the attention kernel once and is within 3x autocast's own error."""
    with torch.no_grad():
        exact = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = model(x).float()
            calls[0] = 0
            got = run(x).float()
    assert calls[0] == 1
    assert (got - exact).abs().max() <= 3 * (autocast - exact).abs().max() + 1e-3


@pytest.mark.parametrize("case", ["need_weights", "cross-attention"])
def test_other_calls_run_the_module(case: str, attention_calls: list[int]) -> None:
    torch.manual_seed(0)
    model = Encoder(need_weights=case == "need_weights", cross=case == "cross-attention").eval()
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        gm = all_passes(model, x)
        attention_calls[0] = 0
        assert close(gm(x), model(x))
    assert attention_calls[0] == 0


def test_a_sequence_first_module_is_not_lowered() -> None:
    model = Encoder(batch_first=False).eval()
    gm = all_passes(model, torch.randn(5, 2, 32))
    assert not _fused(gm)


def test_autograd_runs_the_module() -> None:
    torch.manual_seed(0)
    model = Encoder().eval()
    x = torch.randn(2, 5, 32, requires_grad=True)
    gm = all_passes(model, x.detach())
    gm(x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


HAS_COMPILE = hasattr(torch, "compile") and torch.__version__ >= "2.1"  # (entry-point backends)


@pytest.mark.skipif(not HAS_COMPILE, reason="torch.compile with entry-point backends: torch >= 2.1")
@pytest.mark.parametrize("cross", [False, True])
def test_torch_compile_runs_dynamos_functional_form_on_the_kernels(cross: bool, attention_calls: list[int]) -> None:
    """Dynamo records the module's call as F.multi_head_attention_forward with its weights as arguments: the
    self-attention runs on the kernels (cross-attention runs the function)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Encoder(cross=cross).eval()
    compiled = torch.compile(model, backend="ember")
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        expected = model(x)
        attention_calls[0] = 0
        got = compiled(x)
    assert close(got, expected)
    assert attention_calls[0] == (0 if cross else 1)


@pytest.mark.skipif(not HAS_COMPILE, reason="torch.compile with entry-point backends: torch >= 2.1")
@pytest.mark.skipif(not _C.Linear.supported("bfloat16"), reason="ember's bf16 Linear needs AVX512-BF16 or AMX")
def test_torch_compile_under_bf16_autocast(attention_calls: list[int]) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Encoder().eval()
    compiled = torch.compile(model, backend="ember")
    _check_bf16(compiled, model, torch.randn(3, 9, 32), attention_calls)
