"""Graph capture (ember._graph.capture): which path captures which model, why the others did not, and that a
captured graph computes what the model does, at the sample's sizes and at others."""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

import ember
from ember._graph import capture as capture_module
from ember._graph.capture import EXPORT, MODULES, SYMBOLIC_TRACE, capture, split_sample_input

HAS_EXPORT_AUTO = hasattr(getattr(torch, "export", None), "Dim") and hasattr(torch.export.Dim, "AUTO")


class Functional(nn.Module):
    """A hand-written model in functional calls, with a residual add and a norm."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(32, 16) / 4)
        self.b1 = nn.Parameter(torch.randn(32))
        self.w2 = nn.Parameter(torch.randn(16, 32) / 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(F.linear(x, self.w1, self.b1))
        return F.layer_norm(x + F.linear(h, self.w2), (16,))


class ShapeBranch(nn.Module):
    """Control flow on a shape: symbolic tracing cannot take it, export can (the branch is a guard)."""

    def __init__(self) -> None:
        super().__init__()
        self.wide = nn.Linear(8, 4)
        self.narrow = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] == 8:
            return torch.relu(self.wide(x))
        return self.narrow(x)


class ValueBranch(nn.Module):
    """Control flow on a tensor's value: no capture can keep it."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.linear(x)
        return -x


def test_split_sample_input_takes_every_form() -> None:
    x = torch.ones(2)
    assert split_sample_input(x) == ((x,), {})
    assert split_sample_input((x, x)) == ((x, x), {})
    assert split_sample_input([x]) == ((x,), {})
    assert split_sample_input({"input_ids": x}) == ((), {"input_ids": x})


def test_a_functional_model_is_traced_without_input() -> None:
    model = Functional().eval()
    result = capture(model)
    assert result.path == SYMBOLIC_TRACE and result.failures == []
    assert isinstance(result.graph, fx.GraphModule)
    x = torch.randn(3, 5, 16)
    assert torch.equal(result.graph(x), model(x))
    assert "captured by torch.fx symbolic trace" in result.describe()


def test_the_graph_shares_the_models_parameters() -> None:
    model = Functional().eval()
    result = capture(model)
    assert result.graph is not None
    graph_params = {p.data_ptr() for p in result.graph.parameters()}
    assert {p.data_ptr() for p in model.parameters()} <= graph_params


def test_torchvision_resnet_is_traced_and_checked_on_the_sample() -> None:
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18(num_classes=10).eval()
    x = torch.randn(2, 3, 64, 64)
    result = capture(model, x)
    assert result.path == SYMBOLIC_TRACE and result.graph is not None
    with torch.no_grad():
        y = torch.randn(1, 3, 96, 80)
        assert torch.equal(result.graph(y), model(y))


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_a_shape_branch_falls_to_export_with_the_reason() -> None:
    model = ShapeBranch().eval()
    result = capture(model, torch.randn(4, 8))
    assert result.path == EXPORT and result.graph is not None
    assert [path for path, _ in result.failures] == [SYMBOLIC_TRACE]
    assert "symbolic trace" in result.describe()
    with torch.no_grad():
        other_batch = torch.randn(7, 8)  # the batch is dynamic: no capture again
        assert torch.equal(result.graph(other_batch), model(other_batch))


def test_without_sample_input_export_is_not_tried() -> None:
    result = capture(ShapeBranch().eval())
    assert result.path == MODULES and result.graph is None
    paths = dict(result.failures)
    assert SYMBOLIC_TRACE in paths
    assert EXPORT in paths
    if HAS_EXPORT_AUTO:
        assert paths[EXPORT] == "needs sample_input"
    assert result.describe().startswith("forward not captured")


def test_a_value_branch_is_left_to_the_module_rewrite() -> None:
    model = ValueBranch().eval()
    result = capture(model, torch.randn(4, 8))
    assert result.path == MODULES and result.graph is None
    assert [path for path, _ in result.failures] == [SYMBOLIC_TRACE, EXPORT]


def test_a_graph_that_differs_from_the_model_is_refused() -> None:
    class Stateful(nn.Module):
        """Each call differs from the one before, so no captured graph can match the model's next call."""

        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            return x * self.calls

    result = capture(Stateful().eval(), torch.ones(2))
    assert result.graph is None or result.path == EXPORT
    assert any("differ" in why for _, why in result.failures)


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_a_hugging_face_bert_is_exported_with_dynamic_batch_and_sequence() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 100, (2, 12))
    result = capture(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    assert result.graph is not None, result.describe()
    for batch, length in ((1, 5), (3, 20)):
        other = torch.randint(0, 100, (batch, length))
        mask = torch.ones_like(other)
        with torch.no_grad():
            expected = model(input_ids=other, attention_mask=mask).last_hidden_state
            got = result.graph(input_ids=other, attention_mask=mask)
        got_hidden = got["last_hidden_state"] if isinstance(got, dict) else got[0]
        torch.testing.assert_close(got_hidden, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_a_sample_of_batch_one_still_gives_a_dynamic_batch() -> None:
    """torch.export fixes a dimension of size 1 in the sample; capture doubles the batch so it stays dynamic."""
    model = ShapeBranch().eval()
    result = capture(model, torch.randn(1, 8))
    assert result.path == EXPORT and result.graph is not None
    with torch.no_grad():
        for batch in (1, 2, 5):
            x = torch.randn(batch, 8)
            assert torch.equal(result.graph(x), model(x))


class Sequences(ShapeBranch):
    """ShapeBranch over [batch, sequence, features] inputs."""


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_an_export_past_its_budget_is_done_again_with_the_batch_alone_dynamic(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(capture_module, "_deadline", expired_deadline)  # every export with a budget runs past it
    model = Sequences().eval()
    result = capture(model, torch.randn(2, 5, 8))
    assert result.path == EXPORT and result.graph is not None
    assert [path for path, _ in result.failures] == [SYMBOLIC_TRACE, f"{EXPORT} with every size dynamic"]
    assert "sizes other than the batch fixed" in result.describe()
    with torch.no_grad():
        other_batch = torch.randn(3, 5, 8)
        assert torch.equal(result.graph(other_batch), model(other_batch))
        with pytest.raises(Exception, match="Guard"):  # a fixed size: the graph refuses another
            result.graph(torch.randn(2, 6, 8))
        optimized = ember.optimize(model, sample_input=torch.randn(2, 5, 8))  # whose forward takes it instead
        other_sequence = torch.randn(2, 6, 8)
        assert torch.allclose(optimized(other_sequence), model(other_sequence), rtol=1e-5, atol=1e-6)


@contextlib.contextmanager
def expired_deadline(seconds: float | None, code: tuple[str, ...] = ()) -> Iterator[Any]:
    """capture's deadline as it acts when the budget has run out, at once (the real one raises after a timer's
    expiry, at the next call the model's code makes)."""
    if seconds is not None:
        raise capture_module._OverBudget
    yield capture_module._Expiry()


@contextlib.contextmanager
def expiry_turned_into_an_error(seconds: float | None, code: tuple[str, ...] = ()) -> Iterator[Any]:
    """A deadline that passes inside torch code that catches the expiry and raises an error of its own (torch's
    argument parser, unpacking a symbolic size, raised a TypeError holding _OverBudget)."""
    expiry = capture_module._Expiry()
    yield expiry
    if seconds is not None:
        expiry.fired = True
        raise TypeError('failed to unpack the object at pos 1 with error "_OverBudget"')


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_an_expiry_torch_turned_into_its_own_error_is_still_over_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture_module, "_deadline", expiry_turned_into_an_error)
    result = capture(Sequences().eval(), torch.randn(2, 5, 8))
    assert result.path == EXPORT and result.graph is not None
    assert [path for path, _ in result.failures] == [SYMBOLIC_TRACE, f"{EXPORT} with every size dynamic"]


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="no interval timers here")
def test_the_deadline_says_it_fired_whatever_became_of_its_raise() -> None:
    with pytest.raises(TypeError), capture_module._deadline(0.05, HERE) as expiry:
        try:
            busy(10.0)
        except capture_module._OverBudget as raised:
            raise TypeError("an error of torch's own") from raised
    assert expiry.fired
    with capture_module._deadline(5.0, HERE) as expiry:
        busy(0.01)
    assert not expiry.fired


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


HERE = (__name__,)  # this module as the model's code, where a deadline raises (busy's calls)


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="no interval timers here")
def test_the_deadline_raises_only_from_the_models_code() -> None:
    # Past its expiry, a block that runs none of the model's code is not interrupted (torch's own Python, called
    # back from C++, might not survive an exception it did not plan for); the model's next call is.
    with capture_module._deadline(0.02, ("a_package_that_runs_nothing_here",)) as expiry:
        busy(0.2)
    assert not expiry.fired and sys.getprofile() is None
    started = time.perf_counter()
    with pytest.raises(capture_module._OverBudget), capture_module._deadline(0.02, HERE) as expiry:
        time.sleep(0.2)  # the expiry passes in a C call: raised at the next call the model's code makes
        busy(5.0)
    assert expiry.fired and sys.getprofile() is None
    assert time.perf_counter() - started < 1.0


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="no interval timers here")
def test_the_deadline_leaves_a_programs_profiler_alone() -> None:
    def profiler(frame: Any, event: str, arg: Any) -> None:
        return None

    sys.setprofile(profiler)
    try:
        with capture_module._deadline(0.01, HERE) as expiry:  # not armed: the profiler keeps its place
            busy(0.1)
        assert sys.getprofile() is profiler and not expiry.fired
    finally:
        sys.setprofile(None)


class Deeper(nn.Module):
    """Layers enough that an export spends a while in the model's code and in torch's between its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Sequences() for _ in range(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + torch.cat([layer(x), layer(x)], dim=-1)
        return x


@pytest.mark.skipif(not HAS_EXPORT_AUTO or not hasattr(signal, "setitimer"), reason="no torch.export.Dim.AUTO")
def test_an_export_stopped_at_any_point_leaves_torch_able_to_export_again() -> None:
    # Raised wherever Python was, the expiry aborted the process inside torch's dispatch-mode switching (torch left
    # a FakeTensorMode set, then refused to set one over it in a destructor). Stopped anywhere along the export, torch
    # must be left with no mode set and export the model afterwards.
    model = Deeper().eval()
    x = torch.randn(2, 5, 8)
    shapes = {"x": {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO}}
    started = time.perf_counter()
    torch.export.export(model, (x,), dynamic_shapes=shapes, strict=False)
    took = time.perf_counter() - started
    stopped = 0
    for step in range(1, 9):
        deadline = capture_module._deadline(took * step / 10, capture_module.model_code(model))
        with contextlib.suppress(capture_module._OverBudget), deadline as expiry:
            torch.export.export(model, (x,), dynamic_shapes=shapes, strict=False)
        stopped += expiry.fired
        assert torch._C._len_torch_dispatch_stack() == 0 and torch._C._len_torch_function_stack() == 0
        assert torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is None
        assert torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.PROXY) is None
    assert stopped > 0
    exported = torch.export.export(model, (x,), dynamic_shapes=shapes, strict=False).module()
    with torch.no_grad():
        assert torch.equal(exported(x), model(x))


def test_the_models_code_is_its_own_packages_and_torchs_layers_not_the_rest_of_torch() -> None:
    assert capture_module.model_code(nn.Sequential(nn.Linear(2, 2), nn.ReLU())) == ("torch.nn.modules",)
    assert capture_module.model_code(Sequences()) == tuple(sorted({__name__.split(".")[0], "torch.nn.modules"}))


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="no interval timers here")
def test_the_deadline_interrupts_the_block_and_restores_the_programs_state() -> None:
    with pytest.raises(capture_module._OverBudget), capture_module._deadline(0.05, HERE):
        busy(10.0)
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL and signal.getitimer(signal.ITIMER_REAL)[0] == 0
    with capture_module._deadline(5.0, HERE):  # a block that ends in time: nothing raised, the timer gone
        busy(0.01)
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL and signal.getitimer(signal.ITIMER_REAL)[0] == 0


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="no interval timers here")
def test_the_deadline_leaves_a_programs_own_alarm_alone() -> None:
    alarms = []
    previous = signal.signal(signal.SIGALRM, lambda *_: alarms.append(1))
    try:
        with capture_module._deadline(0.01, HERE):  # not armed: the program's handler stays and nothing is raised
            busy(0.1)
        assert signal.getsignal(signal.SIGALRM) is not signal.SIG_DFL
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert alarms == []


def scaled_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A library's function that symbolic tracing keeps as one call (wrapped below, as torchvision wraps its Swin
    attention)."""
    return F.linear(x, weight, bias) * 2


def doubled(x: torch.Tensor) -> torch.Tensor:
    return x * 2


fx.wrap("scaled_linear")
fx.wrap("doubled")


class Wrapped(nn.Module):
    """A Linear computed inside a wrapped function, on the model's parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 8) / 3)
        self.b = nn.Parameter(torch.randn(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return doubled(torch.relu(scaled_linear(x, self.w, self.b)))


def test_a_wrapped_function_on_the_parameters_is_named_as_hidden() -> None:
    gm = fx.symbolic_trace(Wrapped())
    assert capture_module.hidden_layers(gm) == ["scaled_linear"]  # doubled takes no parameter
    assert capture_module.hidden_layers(fx.symbolic_trace(Functional())) == []


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_export_is_preferred_where_the_trace_hides_layers_in_a_wrapped_function() -> None:
    model = Wrapped().eval()
    result = capture(model, torch.randn(4, 8))
    assert result.path == EXPORT and result.graph is not None
    [(path, why)] = result.failures
    assert path == SYMBOLIC_TRACE and "scaled_linear" in why
    assert not any(n.op == "call_function" and n.target is scaled_linear for n in result.graph.graph.nodes)
    with torch.no_grad():
        other = torch.randn(7, 8)
        assert torch.equal(result.graph(other), model(other))


def test_without_export_the_trace_with_a_wrapped_function_is_kept() -> None:
    model = Wrapped().eval()
    result = capture(model)  # no sample: export is not tried
    assert result.path == SYMBOLIC_TRACE and result.graph is not None
    with torch.no_grad():
        x = torch.randn(3, 8)
        assert torch.equal(result.graph(x), model(x))


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_an_export_past_its_shorter_budget_is_taken_with_the_batch_alone_dynamic(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(capture_module, "_deadline", expired_deadline)
    model = Wrapped().eval()
    result = capture(model, torch.randn(4, 8))
    assert result.path == EXPORT and result.graph is not None
    reasons = dict(result.failures)
    assert "scaled_linear" in reasons[SYMBOLIC_TRACE]
    assert "over" in reasons[f"{EXPORT} with every size dynamic"]
    assert not any(n.op == "call_function" and n.target is scaled_linear for n in result.graph.graph.nodes)
    with torch.no_grad():
        other_batch = torch.randn(7, 8)
        assert torch.equal(result.graph(other_batch), model(other_batch))


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_an_export_that_fails_leaves_the_trace_with_a_wrapped_function(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("this model does not export")

    monkeypatch.setattr(torch.export, "export", refused)
    model = Wrapped().eval()
    result = capture(model, torch.randn(4, 8))
    assert result.path == SYMBOLIC_TRACE and result.graph is not None  # dynamic in every size, hidden layers and all
    [(path, why)] = result.failures
    assert path == EXPORT and "does not export" in why


class SlowToCollect:
    """An object whose finalizer runs past a deadline: the expiry lands in it, where Python does not raise."""

    def __del__(self) -> None:
        busy(0.2)


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="no interval timers here")
def test_an_expiry_that_lands_in_a_finalizer_is_raised_again() -> None:
    started = time.perf_counter()
    with pytest.raises(capture_module._OverBudget), capture_module._deadline(0.05, HERE):
        SlowToCollect()  # collected at once: the deadline passes inside its finalizer
        busy(5.0)
    assert time.perf_counter() - started < 2.0
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, signal.SIG_IGN, None)


class Images(nn.Module):
    """A convolution whose output's size decides a branch: torch.export must reason over the height and width."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        y = self.conv(pixels)
        if y.shape[-1] % 2 == 0:
            y = F.pad(y, (0, 1))
        return y.flatten(1)


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_an_images_height_and_width_are_fixed_without_a_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture_module, "_deadline", expired_deadline)  # an export with a budget would fail
    model = Images().eval()
    result = capture(model, {"pixels": torch.randn(2, 3, 8, 8)})
    assert result.path == EXPORT and result.graph is not None, result.describe()
    assert "an image's sizes but the batch are fixed" in result.describe()
    assert "every size dynamic" not in result.describe()  # no export with a budget was tried
    with torch.no_grad():
        other_batch = torch.randn(5, 3, 8, 8)
        assert torch.equal(result.graph(pixels=other_batch), model(other_batch))
        with pytest.raises(Exception, match="Guard"):
            result.graph(pixels=torch.randn(2, 3, 9, 9))
        optimized = ember.optimize(model, sample_input={"pixels": torch.randn(2, 3, 8, 8)})
        other_size = torch.randn(2, 3, 9, 9)
        torch.testing.assert_close(optimized(other_size), model(other_size), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="this torch has no torch.export.Dim.AUTO")
def test_an_input_beside_an_image_keeps_its_sizes_dynamic() -> None:
    class Captioned(Images):
        def forward(self, pixels: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            return super().forward(pixels).sum(1, keepdim=True) + tokens.float()

    model = Captioned().eval()
    result = capture(model, (torch.randn(2, 3, 8, 8), torch.randint(0, 9, (2, 5))))
    assert result.path == EXPORT and result.graph is not None, result.describe()
    with torch.no_grad():
        pixels, tokens = torch.randn(3, 3, 8, 8), torch.randint(0, 9, (3, 11))
        assert torch.equal(result.graph(pixels, tokens), model(pixels, tokens))
