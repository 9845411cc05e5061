"""``ember.optimize(model.eval(), dtype=torch.float16)``: on a CPU with AVX512-FP16 (or AMX-FP16) the layers compute
in fp16 on oneDNN's native kernels, in the module-level and the graph path, and the model matches torch's own fp16
autocast within its error; on any other CPU, or a torch without CPU autocast to float16, a ValueError names the
dtype to use. Training in fp16 says it is not implemented."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ember
from ember import _C
from ember._optimize.inference.common import cpu_autocast_takes
from ember._tensor import dlpack

RUNS_FP16 = _C.Linear.supported("float16") and cpu_autocast_takes(torch.float16)
needs_fp16 = pytest.mark.skipif(not RUNS_FP16, reason="this CPU (or torch) has no native float16")


class Block(nn.Module):
    """A CNN stem and an MLP head: conv + BN + ReLU, a residual, a gated MLP, GELU."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.gate, self.up = nn.Linear(16, 48), nn.Linear(16, 48)
        self.down = nn.Linear(48, 16)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.conv(x)))
        h = torch.relu(self.conv2(h) + h)
        v = h.mean((2, 3))
        v = v + self.down(F.silu(self.gate(v)) * self.up(v))
        return self.head(F.gelu(v))


def _errors(optimized: nn.Module, model: nn.Module, x: torch.Tensor) -> tuple[float, float, torch.dtype]:
    """(ember's distance from fp32, fp16 autocast's distance from fp32, ember's output dtype)."""
    with torch.no_grad():
        exact = model(x)
        with torch.autocast("cpu", dtype=torch.float16):
            autocast = model(x)
        got = optimized(x)
    return float((got.float() - exact).abs().max()), float((autocast.float() - exact).abs().max()), got.dtype


@needs_fp16
@pytest.mark.parametrize("graph_mode", [False, True])
def test_float16_matches_torchs_float16_autocast(graph_mode: bool) -> None:
    torch.manual_seed(0)
    model = Block().eval()
    for p in model.bn.parameters():
        nn.init.uniform_(p, 0.5, 1.5)
    x = torch.randn(2, 3, 12, 10)
    optimized = ember.optimize(copy.deepcopy(model), dtype=torch.float16, graph_mode=graph_mode, sample_input=x)
    err, autocast_err, dtype = _errors(optimized, model, x)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        assert dtype == model(x).dtype
    assert err <= 3 * autocast_err + 1e-3, (err, autocast_err)
    # The parameters and state_dict stay the model's (fp32), and a second batch size needs no new optimize.
    assert all(p.dtype == torch.float32 for p in optimized.parameters())
    _errors(optimized, model, torch.randn(5, 3, 12, 10))


@needs_fp16
def test_a_hugging_face_encoder_in_float16() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128
    )
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 100, (2, 9))
    optimized = ember.optimize(copy.deepcopy(model), dtype=torch.float16)
    with torch.no_grad():
        exact = model(ids).last_hidden_state
        with torch.autocast("cpu", dtype=torch.float16):
            autocast = model(ids).last_hidden_state.float()
        got = optimized(ids).last_hidden_state.float()
    assert float((got - exact).abs().max()) <= 3 * float((autocast - exact).abs().max()) + 1e-3


@needs_fp16
@pytest.mark.parametrize("rows", [1, 7, 300])
def test_the_float16_linear_binding_against_float64(rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 96, generator=gen).half()
    weight = torch.randn(40, 96, generator=gen) / 10
    bias, up = torch.randn(40, generator=gen), torch.randn(rows, 40, generator=gen).half()
    layer = _C.Linear(dlpack(weight), dlpack(bias), "float16", True)
    out = torch.empty(rows, 40, dtype=torch.float16)
    layer.forward(dlpack(x), None, dlpack(out), ["silu", "mul"], dlpack(up))
    expected = F.silu(F.linear(x.double(), weight.half().double(), bias.double())) * up.double()
    torch.testing.assert_close(out.double(), expected, rtol=4e-3, atol=4e-3)


@pytest.mark.skipif(RUNS_FP16, reason="this CPU and torch run float16")
def test_without_native_float16_the_call_names_the_dtype_to_use() -> None:
    model = nn.Linear(4, 4).eval()
    with pytest.raises(ValueError, match=r"float16.*(AVX512-FP16|autocast).*use dtype=torch\.(bfloat16|float32)"):
        ember.optimize(model, dtype=torch.float16)
    assert model.weight.dtype == torch.float32 and "forward" not in model.__dict__


@pytest.mark.skipif(_C.Linear.supported("float16"), reason="this CPU has native float16")
def test_without_native_float16_the_bindings_refuse_it() -> None:
    weight = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="float16"):
        _C.Linear(dlpack(weight), None, "float16", True)


def test_float16_training_is_not_implemented() -> None:
    model = nn.Linear(4, 4).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(NotImplementedError, match="bfloat16"):
        ember.optimize(model, optimizer=optimizer, dtype=torch.float16)
