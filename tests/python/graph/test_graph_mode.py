"""``ember.optimize(model.eval(), graph_mode=True)`` (the default where ``sample_input`` is given): the captured,
rewritten graph as the model's forward, with the model's own state, on real architectures and on a hand-written
functional model."""

from __future__ import annotations

import copy
import io
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from graphs import HAS_EXPORT_AUTO, assert_matches, graph_forward
from torch import nn

import ember
from ember import _C
from ember._optimize.graph.forward import GraphForward
from ember._optimize.graph.nodes import FusedLayer

BF16 = _C.Linear.supported("bfloat16") and _C.Convolution.supported("bfloat16")


class Functional(nn.Module):
    """A hand-written model in functional calls: conv + frozen batch norm + ReLU, a residual block, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.k1 = nn.Parameter(torch.randn(8, 3, 3, 3) / 4)
        self.k2 = nn.Parameter(torch.randn(8, 8, 3, 3) / 8)
        self.register_buffer("mean", torch.randn(8) / 4)
        self.register_buffer("var", torch.rand(8) + 0.5)
        self.w = nn.Parameter(torch.randn(10, 8) / 3)
        self.b = nn.Parameter(torch.randn(10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(F.batch_norm(F.conv2d(x, self.k1, padding=1), self.mean, self.var, training=False))
        y = F.hardswish(F.conv2d(y, self.k2, padding=1) + y)
        return F.linear(F.dropout(y.mean((2, 3)), 0.2, training=False), self.w, self.b)


def test_the_functional_model_runs_as_one_graph() -> None:
    torch.manual_seed(0)
    model = Functional().eval()
    x = torch.randn(2, 3, 12, 10)
    optimized = ember.optimize(model, graph_mode=True)
    forward = graph_forward(optimized)
    assert forward.path == "torch.fx symbolic trace"
    code = forward.graph.code
    assert "batch_norm" not in code and "dropout" not in code and "relu" not in code
    assert_matches(optimized, model, x, 1e-5, 1e-5)
    assert_matches(optimized, model, torch.randn(5, 3, 7, 9), 1e-5, 1e-5)  # other sizes, the same graph


def test_the_models_state_and_tree_are_its_own() -> None:
    torch.manual_seed(0)
    model = Functional().eval()
    optimized = ember.optimize(model, graph_mode=True)
    assert type(optimized) is Functional
    assert list(optimized.state_dict()) == list(model.state_dict())
    for (name, mine), theirs in zip(optimized.state_dict().items(), model.state_dict().values()):
        assert torch.equal(mine, theirs), name
    assert [n for n, _ in optimized.named_modules()] == [n for n, _ in model.named_modules()]


def test_save_load_and_deepcopy_keep_the_graph() -> None:
    torch.manual_seed(0)
    model = Functional().eval()
    x = torch.randn(2, 3, 8, 8)
    optimized = ember.optimize(model, graph_mode=True, sample_input=x)
    buffer = io.BytesIO()
    torch.save(optimized, buffer)
    buffer.seek(0)
    kwargs = {"weights_only": False} if "weights_only" in torch.load.__code__.co_varnames else {}
    for clone in (torch.load(buffer, **kwargs), copy.deepcopy(optimized)):
        graph_forward(clone)
        assert_matches(clone, model, x, 1e-5, 1e-5)
        with torch.no_grad():
            clone.w.mul_(2)  # the clone's own parameters: the original is untouched
        assert not torch.equal(clone.w, model.w)


def test_loaded_weights_are_used() -> None:
    torch.manual_seed(0)
    model = Functional().eval()
    x = torch.randn(2, 3, 8, 8)
    optimized = ember.optimize(model, graph_mode=True, sample_input=x)
    other = Functional().eval()
    optimized.load_state_dict(other.state_dict())
    assert_matches(optimized, other, x, 1e-5, 1e-5)
    optimized.load_state_dict(Functional().state_dict(), assign=True) if _assign_works() else None
    if _assign_works():
        assert_matches(optimized, _with_state(optimized), x, 1e-5, 1e-5)


def _assign_works() -> bool:
    import inspect

    return "assign" in inspect.signature(nn.Module.load_state_dict).parameters


def _with_state(optimized: nn.Module) -> nn.Module:
    reference = Functional().eval()
    reference.load_state_dict(optimized.state_dict())
    return reference


def test_train_mode_and_autograd_run_torch() -> None:
    torch.manual_seed(0)
    model = Functional().eval()
    optimized = ember.optimize(model, graph_mode=True)
    x = torch.randn(2, 3, 8, 8)
    optimized.train()
    model.train()
    torch.manual_seed(1)
    got = optimized(x)
    torch.manual_seed(1)
    expected = model(x)
    assert torch.equal(got, expected)
    optimized.eval()
    model.eval()
    x.requires_grad_(True)
    optimized(x).sum().backward()
    grad = x.grad.clone()
    x.grad = None
    model(x).sum().backward()
    assert torch.allclose(grad, x.grad, rtol=1e-5, atol=1e-6)


def test_a_hook_added_after_optimizing_still_runs() -> None:
    torch.manual_seed(0)

    class Modules(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.act = nn.ReLU()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.act(self.fc(x))

    model = Modules().eval()
    optimized = ember.optimize(model, graph_mode=True)
    seen: list[torch.Tensor] = []
    optimized.fc.register_forward_hook(lambda module, args, out: seen.append(out))
    x = torch.randn(3, 8)
    assert_matches(optimized, model, x, 1e-5, 1e-5)
    assert len(seen) == 1


def test_the_report_names_the_path_and_the_rewrite(capsys: pytest.CaptureFixture[str]) -> None:
    ember.optimize(Functional().eval(), graph_mode=True, report=True)
    out = capsys.readouterr().out
    assert "forward captured by torch.fx symbolic trace" in out
    assert "graph mode: 3 layer(s) on ember's kernels, 1 BatchNorm(s) folded" in out
    line = next(text for text in out.splitlines() if "graph mode:" in text)
    assert " 0 " not in line  # what no pass did goes unsaid


def test_a_model_no_path_captures_keeps_the_module_rewrite(capsys: pytest.CaptureFixture[str]) -> None:
    class ValueBranch(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) if x.sum() > 0 else -x

    model = ValueBranch().eval()
    optimized = ember.optimize(model, graph_mode=True, sample_input=torch.ones(2, 4), report=True)
    assert "forward not captured" in capsys.readouterr().out
    assert not isinstance(optimized.__dict__.get("forward"), GraphForward)
    assert_matches(optimized, model, torch.ones(2, 4), 1e-5, 1e-5)


def test_graph_mode_is_the_default_where_a_sample_checks_it() -> None:
    """With ``sample_input`` the graph is captured, checked on it and used; without one, or with
    ``graph_mode=False``, the module-level rewrite runs."""
    torch.manual_seed(0)
    model = Functional().eval()
    x = torch.randn(2, 3, 12, 10)
    with_sample = ember.optimize(model, sample_input=x)
    assert isinstance(with_sample.__dict__.get("forward"), GraphForward)
    assert_matches(with_sample, model, x, 1e-5, 1e-5)
    for optimized in (ember.optimize(model), ember.optimize(model, sample_input=x, graph_mode=False)):
        assert not isinstance(optimized.__dict__.get("forward"), GraphForward)
        assert_matches(optimized, model, x, 1e-5, 1e-5)


def test_graph_mode_is_checked() -> None:
    with pytest.raises(TypeError, match="graph_mode"):
        ember.optimize(Functional().eval(), graph_mode="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="graph_mode"):
        ember.optimize(Functional().train(), graph_mode=True)


def test_a_torchvision_resnet() -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.uniform_(m.running_mean, -0.2, 0.2)
    optimized = ember.optimize(model, graph_mode=True)
    forward = graph_forward(optimized)
    assert "batch_norm" not in forward.graph.code
    assert_matches(optimized, model, torch.randn(2, 3, 64, 64), 1e-4, 1e-4)


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_hugging_face_models_are_exported_and_rewritten(family: str) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if family == "bert":
        config = transformers.BertConfig(
            vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
        )
        model = transformers.BertModel(config).eval()
    else:
        config = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=64)
        model = transformers.GPT2Model(config).eval()
    # GPT-2 returns its key-value cache unless told not to, an object torch.export cannot flatten.
    options = {"use_cache": False} if family == "gpt2" else {}
    ids = torch.randint(0, 100, (2, 12))
    sample = {"input_ids": ids, "attention_mask": torch.ones_like(ids), **options}
    optimized = ember.optimize(model, graph_mode=True, sample_input=sample)
    forward = graph_forward(optimized)
    assert forward.path == "torch.export"
    # Every projection is on ember's kernels: BERT's nn.Linear, GPT-2's Conv1D (an addmm in the exported graph).
    fused = [m for m in forward.graph.modules() if isinstance(m, FusedLayer)]
    assert len(fused) == (13 if family == "bert" else 8)
    assert_matches(optimized, model, sample, 1e-5, 1e-5)
    other = torch.randint(0, 100, (3, 20))  # another batch and length: the same graph
    other_input = {"input_ids": other, "attention_mask": torch.ones_like(other), **options}
    assert_matches(optimized, model, other_input, 1e-5, 1e-5)
    # Arguments the graph was not captured with (no attention mask): the model's own forward runs them.
    assert_matches(optimized, model, {"input_ids": other, **options}, 1e-5, 1e-5)


@pytest.mark.skipif(not BF16, reason="oneDNN has no bf16 matmul or convolution on this CPU (needs AVX-512)")
def test_bf16_is_within_autocasts_error() -> None:
    torch.manual_seed(0)
    model = Functional().eval()
    x = torch.randn(4, 3, 12, 12)
    optimized = ember.optimize(model, dtype=torch.bfloat16, graph_mode=True)
    graph_forward(optimized)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = model(x).float()
    reference = model(x).double()
    with torch.no_grad():
        got = optimized(x).float()
    # ember's error against float64 is no more than twice autocast's own (both round to bf16 at each layer).
    assert (got.double() - reference).abs().max() <= 2 * (autocast.double() - reference).abs().max() + 1e-2


def test_a_rewritten_graph_that_fails_on_the_sample_is_not_installed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ember._optimize.graph import passes

    def broken(gm: torch.fx.GraphModule, *args: Any) -> list[str]:
        output = next(n for n in gm.graph.nodes if n.op == "output")
        with gm.graph.inserting_before(output):
            gm.graph.call_function(torch.ones, (-1,))  # raises at run time
        gm.recompile()
        return []

    monkeypatch.setattr(passes, "lower_layers", broken)
    model = Functional().eval()
    x = torch.randn(2, 3, 8, 8)
    optimized = ember.optimize(model, graph_mode=True, sample_input=x, report=True)
    assert "graph mode not used: the rewritten graph failed on sample_input (RuntimeError" in capsys.readouterr().out
    assert not isinstance(optimized.__dict__.get("forward"), GraphForward)
    assert_matches(optimized, model, x, 1e-5, 1e-5)


class Branching(nn.Module):
    """Control flow on a shape (only torch.export captures it) and an optional keyword input."""

    def __init__(self) -> None:
        super().__init__()
        self.wide = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        y = torch.relu(self.wide(x)) if x.shape[-1] == 8 else x[..., :4]
        return y if scale is None else y * scale


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
@pytest.mark.parametrize(
    "sample, call",
    [
        ("keywords", "positional"),  # ember.optimize(m, sample_input={"x": t}), then m(t): the benchmarks' form
        ("positional", "keywords"),
        ("keywords", "keywords"),
    ],
)
def test_an_exported_graph_takes_its_inputs_in_either_form(
    sample: str, call: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    model = Branching().eval()
    x = torch.randn(3, 8)
    optimized = ember.optimize(model, graph_mode=True, sample_input={"x": x} if sample == "keywords" else (x,))
    assert graph_forward(optimized).path == "torch.export"

    def refused(self: GraphForward, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the graph was not used")

    monkeypatch.setattr(GraphForward, "without_graph", refused)
    other = torch.randn(5, 8)
    with torch.no_grad():
        got = optimized(other) if call == "positional" else optimized(x=other)
    torch.testing.assert_close(got, model(other))


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_an_input_the_exported_graph_has_no_place_for_runs_the_models_forward() -> None:
    torch.manual_seed(0)
    model = Branching().eval()
    x = torch.randn(3, 8)
    optimized = ember.optimize(model, graph_mode=True, sample_input={"x": x})
    scale = torch.full((4,), 2.0)
    with torch.no_grad():
        torch.testing.assert_close(optimized(x, scale), model(x, scale))
