"""Graph mode's fast calls (``_optimize/graph/fast_calls.py``): inside a forward whose guard passed, a fused layer
whose last kernel call had inputs like this one's calls its kernel at once. Each test runs a model twice or more and
checks that the second call took the fast call, and that whatever the guard or the call must notice (a changed,
replaced or re-pointed weight, a folded BatchNorm's statistics, another shape, dtype, operand or autocast, autograd,
the profiler, a copy) still gives the model's own result."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from graphs import graph_forward
from torch import nn

import ember
from ember import _C
from ember._optimize.graph import fast_calls, norm_node
from ember._optimize.inference import conv, linear
from ember._tensor import dlpack

BF16 = _C.Linear.supported("bfloat16") and _C.Convolution.supported("bfloat16")


class Block(nn.Module):
    """A convolution with a BatchNorm folded into it and a ReLU, a residual add onto the next convolution's output,
    and a Linear head with a GELU: each kind of fused layer, with and without an operand."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(4, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Linear(8, 6)
        self.out = nn.Linear(6, 6)
        with torch.no_grad():
            self.bn.running_mean.normal_()
            self.bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn(self.conv1(x)))
        y = self.conv2(y) + y
        h = F.gelu(self.head(y.mean((2, 3))))
        return self.out(h) + h


@pytest.fixture(autouse=True)
def ember_takes_every_fp32_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where torch's fp32 matmul is MKL's on an Intel CPU the router hands these small fp32 Linears (2 rows) to
    torch, whose call has no fast call to take: ember's kernels take them here on every CPU, so that what is tested is
    the fast call; a layer routed to torch has its own test below."""
    monkeypatch.setattr(linear, "torch_fp32_matmul_is_mkl_on_intel", lambda: False)


@pytest.fixture
def general_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times the fused layers take their general call (linear.run or conv.run)."""
    calls = [0]
    for module in (linear, conv):
        real = module.run

        def counted(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            calls[0] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, "run", counted)
    return calls


def _optimized(dtype: torch.dtype = torch.float32) -> tuple[nn.Module, nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(2, 4, 6, 6)
    optimized = ember.optimize(copy.deepcopy(model), dtype=dtype, graph_mode=True, sample_input=x)
    assert graph_forward(optimized).path == "torch.fx symbolic trace"
    return model, optimized, x


def _check(optimized: nn.Module, model: nn.Module, x: torch.Tensor, tol: float = 1e-5) -> None:
    with torch.no_grad():
        got, expected = optimized(x), model(x)
    torch.testing.assert_close(got.float(), expected.float(), rtol=tol, atol=tol)


def _fast_then(optimized: nn.Module, x: torch.Tensor, calls: list[int]) -> Iterator[None]:
    """Runs ``optimized`` once (making the fast calls) and says the next call took none of the general ones."""
    with torch.no_grad():
        optimized(x)
        calls[0] = 0
        optimized(x)
    assert calls[0] == 0
    yield


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(not BF16, reason="no bf16 layers here"))],
    ids=str,
)
def test_the_fast_calls_give_the_general_calls_result(
    dtype: torch.dtype, general_calls: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bit for bit: the same kernels on the same inputs, the model's fp32 NCHW input converted and laid out as the
    general call does it (bf16: rounded, then channels-last)."""
    model, optimized, x = _optimized(dtype)
    with torch.no_grad():
        optimized(x)  # (ember.optimize's check on the sample made them already: the same sizes)
        general_calls[0] = 0
        fast = optimized(x)
        assert general_calls[0] == 0
        monkeypatch.setattr(fast_calls.GraphGuard, "passes", lambda self: 0)
        general = optimized(x)
    assert general_calls[0] == 4  # two convolutions, two Linears
    assert fast.dtype == general.dtype and torch.equal(fast, general)
    _check(optimized, model, x, 1e-5 if dtype == torch.float32 else 5e-2)
    assert fast_calls.CHECKED.epoch == 0  # the forward restored it


def _change_in_place(model: nn.Module) -> None:
    model.conv1.weight.mul_(0.5)
    model.out.weight.add_(1.0)


def _replace(model: nn.Module) -> None:
    model.conv2.weight = nn.Parameter(torch.randn_like(model.conv2.weight))
    model.out.weight = nn.Parameter(torch.randn_like(model.out.weight))


def _repoint(model: nn.Module) -> None:
    model.head.weight.data = torch.randn_like(model.head.weight)  # no version bump: the data pointer tells


def _restat(model: nn.Module) -> None:
    model.bn.running_mean.add_(1.0)  # a buffer folded into conv1's packed weights


@pytest.mark.parametrize("change", [_change_in_place, _replace, _repoint, _restat], ids=lambda f: f.__name__[1:])
def test_a_changed_tensor_is_seen_on_the_next_call(change: Any, general_calls: list[int]) -> None:
    _, optimized, x = _optimized()
    for _ in _fast_then(optimized, x, general_calls):
        with torch.no_grad():
            change(optimized)
        _check(optimized, _reference(optimized), x)
        assert general_calls[0] > 0  # the changed layers were planned again
        general_calls[0] = 0
        _check(optimized, _reference(optimized), x)
        assert general_calls[0] == 0  # and are fast again


def _reference(optimized: nn.Module) -> nn.Module:
    reference = Block().eval()
    reference.load_state_dict(optimized.state_dict())
    return reference


def test_other_inputs_take_the_general_call(general_calls: list[int]) -> None:
    model, optimized, x = _optimized()
    for _ in _fast_then(optimized, x, general_calls):
        for other in (torch.randn(3, 4, 5, 7), x.contiguous(memory_format=torch.channels_last), x.double().float()):
            _check(optimized, model, other)
        _check(optimized, model, torch.randn(3, 4, 5, 7))  # its fast calls, made by the call before
        _check(optimized, model, x)


def test_autocast_and_autograd_leave_it_to_the_general_call(general_calls: list[int]) -> None:
    """An fp32 layer under a bf16 autocast computes what autocast says (torch's call); with autograd on, the
    guard does not pass and the layers decide as they always did."""
    model, optimized, x = _optimized()
    for _ in _fast_then(optimized, x, general_calls):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            got, expected = optimized(x), model(x)
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got.float(), expected.float(), rtol=0, atol=0)
        x.requires_grad_(True)
        got = optimized(x)
        got.sum().backward()
        assert x.grad is not None and optimized.conv1.weight.grad is not None
        torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)


def test_the_profiler_sees_the_kernels() -> None:
    _, optimized, x = _optimized()
    with torch.no_grad():
        optimized(x)
        with torch.profiler.profile() as profile:
            optimized(x)
    names = {event.name for event in profile.events()}
    assert {"ember::convolution", "ember::linear"} <= names


def test_a_copy_makes_its_own(general_calls: list[int]) -> None:
    model, optimized, x = _optimized()
    for _ in _fast_then(optimized, x, general_calls):
        clone = copy.deepcopy(optimized)
        with torch.no_grad():
            clone.out.weight.mul_(2)
        _check(clone, _reference(clone), x)
        _check(optimized, model, x)  # the original's weights and fast calls are its own


def test_a_failing_call_restores_the_thread_state() -> None:
    _, optimized, x = _optimized()
    with torch.no_grad():
        optimized(x)
        with pytest.raises(RuntimeError):
            optimized(torch.randn(2, 5, 6, 6))  # the wrong channels: the model's own forward raises
    assert fast_calls.CHECKED.epoch == 0


def test_the_guard_reads_the_tensors_the_layers_read() -> None:
    """GraphGuard compares where each LayerState.refs entry points, in tensors()' order."""
    _, optimized, x = _optimized()
    with torch.no_grad():
        optimized(x)
    guard = graph_forward(optimized).guard()
    assert len(guard.layers) == 4
    for state, refs in guard.layers:
        tensors = state.tensors()
        assert len(refs) == len(tensors)
        assert all((r is None and t is None) or r.get() is t for r, t in zip(refs, tensors))


class _Recording:
    """A convolution kernel's stand-in that records the strides of the input it is handed, then runs the kernel."""

    def __init__(self, kernel: Any, strides: list[tuple[int, ...]]) -> None:
        self.kernel, self.strides = kernel, strides

    def forward(self, x: Any, *rest: Any) -> None:
        t = torch.from_dlpack(x)
        self.strides.append(t.stride())
        self.kernel.forward(dlpack(t), *rest)


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(not BF16, reason="no bf16 layers here"))],
    ids=str,
)
def test_a_convolution_gets_its_input_channels_last(dtype: torch.dtype) -> None:
    """The model's NCHW input is converted, then laid out channels-last, as the general call does: the kernel's
    primitive is built for that layout (another would be a second, slower primitive)."""
    _, optimized, x = _optimized(dtype)
    first = next(m for m in graph_forward(optimized).graph.modules() if type(m).__name__ == "FusedConv")
    fast = first.state.cache.fast
    assert isinstance(fast, fast_calls.FastConv)
    strides: list[tuple[int, ...]] = []
    fast.kernel = _Recording(fast.kernel, strides)
    with torch.no_grad():
        optimized(x)
    expected = torch.empty(x.shape).contiguous(memory_format=torch.channels_last).stride()
    assert strides == [expected]


def test_a_layer_another_guard_did_not_check_takes_the_general_call(general_calls: list[int]) -> None:
    """Inside a forward whose guard passed, a fused layer that guard did not check (another graph's, reached some
    other way) runs its general call, which checks its own tensors."""
    _, optimized, x = _optimized()
    for _ in _fast_then(optimized, x, general_calls):
        head = next(m for m in graph_forward(optimized).graph.modules() if type(m).__name__ == "FusedLinear")
        fast = head.state.cache.fast
        assert isinstance(fast, fast_calls.FastLinear)
        like = torch.randn(fast.shape, dtype=fast.dtype)  # an input its fast call takes
        operand = None if fast.operand_dtype is None else torch.randn(fast.out_shape, dtype=fast.operand_dtype)
        with torch.no_grad():
            with fast_calls.checked(fast_calls.GraphGuard([])):
                assert fast_calls.CHECKED.epoch != 0
                head(like, operand)
            assert general_calls[0] == 1
            with fast_calls.checked(graph_forward(optimized).guard()):  # its own guard: the fast call
                head(like, operand)
            assert general_calls[0] == 1


def test_a_layer_routed_to_torch_takes_its_general_call_every_time(
    general_calls: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the router gives a layer's calls to torch (fp32 Linears of 2 rows, where torch's fp32 matmul is MKL's
    on an Intel CPU) no fast call is made for it: each forward runs its general call, with the model's result, and
    the other layers still take theirs."""
    monkeypatch.setattr(linear, "torch_fp32_matmul_is_mkl_on_intel", lambda: True)
    model, optimized, x = _optimized()
    with torch.no_grad():
        optimized(x)
        for _ in range(2):
            general_calls[0] = 0
            got = optimized(x)
            assert general_calls[0] == 2  # the two Linears; the convolutions took their fast calls
            torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)
    heads = [m for m in graph_forward(optimized).graph.modules() if type(m).__name__ == "FusedLinear"]
    assert len(heads) == 2 and all(head.state.cache.fast is None for head in heads)


# The norm node's fast call (norm_node.FastNorm): the same checks, for LayerNorm and RMSNorm nodes.


class Norms(nn.Module):
    """A residual add and a LayerNorm whose sum is read again (a pre-norm block), then an RMSNorm written out."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(16)
        self.rms_weight = nn.Parameter(torch.rand(16) + 0.5)
        with torch.no_grad():
            self.ln.weight.uniform_(0.5, 1.5)
            self.ln.bias.normal_()

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        h = x + r
        y = self.ln(h)
        z = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6) * self.rms_weight
        return z + h


@pytest.fixture
def general_norms(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times the norm nodes take their general kernel call."""
    calls = [0]
    real = norm_node.FusedNorm._on_kernel

    def counted(self: Any, *args: Any) -> Any:
        calls[0] += 1
        return real(self, *args)

    monkeypatch.setattr(norm_node.FusedNorm, "_on_kernel", counted)
    return calls


def _optimized_norms(dtype: torch.dtype = torch.float32) -> tuple[nn.Module, nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = Norms().eval()
    inputs = (torch.randn(2, 5, 16) * 3 + 1, torch.randn(2, 5, 16))
    optimized = ember.optimize(copy.deepcopy(model), dtype=dtype, graph_mode=True, sample_input=inputs)
    assert len(_norm_nodes(optimized)) == 2
    return model, optimized, inputs


def _norm_nodes(optimized: nn.Module) -> list[Any]:
    return [m for m in graph_forward(optimized).graph.modules() if isinstance(m, norm_node.FusedNorm)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_norm_nodes_fast_call_gives_its_general_calls_result(
    dtype: torch.dtype, general_norms: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, optimized, inputs = _optimized_norms(dtype)
    with torch.no_grad():
        optimized(*inputs)
        assert all(isinstance(n._fast, norm_node.FastNorm) for n in _norm_nodes(optimized))
        general_norms[0] = 0
        fast = optimized(*inputs)
        assert general_norms[0] == 0
        monkeypatch.setattr(fast_calls.GraphGuard, "passes", lambda self: 0)
        general = optimized(*inputs)
        expected = model(*inputs)
    assert general_norms[0] == 2
    assert fast.dtype == general.dtype and torch.equal(fast, general)
    tol = 1e-5 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(fast.float(), expected, rtol=tol, atol=tol)


def _norm_weight_in_place(model: nn.Module) -> None:
    model.ln.weight.mul_(-2.0)


def _norm_weight_replaced(model: nn.Module) -> None:
    model.rms_weight = nn.Parameter(torch.rand(16, dtype=torch.float64).float() * 3)


def _norm_weight_repointed_to_bf16(model: nn.Module) -> None:
    model.rms_weight.data = model.rms_weight.data.bfloat16()  # the same Parameter, of another dtype


@pytest.mark.parametrize(
    "change", [_norm_weight_in_place, _norm_weight_replaced, _norm_weight_repointed_to_bf16], ids=lambda f: f.__name__
)
def test_a_norm_reads_its_weights_as_they_are_now(change: Any, general_norms: list[int]) -> None:
    """The node reads its weight and bias on every call: a change in place, a replaced parameter, or one re-pointed
    to another dtype (which changes the result's dtype rules: the general call plans it again) all show."""
    _, optimized, inputs = _optimized_norms()
    with torch.no_grad():
        optimized(*inputs)
        change(optimized)
        got = optimized(*inputs)
        expected = Norms.forward(optimized, *inputs)  # the model's own forward, on its tensors as they are now
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    if change is _norm_weight_repointed_to_bf16:
        assert general_norms[0] > 0


def test_a_norm_call_unlike_the_last_takes_the_general_call(general_norms: list[int]) -> None:
    """Another shape, layout or residual dtype, or autocast switched on: the general call, and torch's result."""
    model, optimized, inputs = _optimized_norms()
    x, r = inputs
    others = [
        (torch.randn(3, 4, 16), torch.randn(3, 4, 16)),
        (x.transpose(0, 1).contiguous().transpose(0, 1), r),
        (x, r.bfloat16()),
    ]
    with torch.no_grad():
        optimized(*inputs)
        for other in others:
            general_norms[0] = 0
            torch.testing.assert_close(optimized(*other), model(*other), rtol=1e-5, atol=1e-5)
            assert general_norms[0] > 0
        with torch.autocast("cpu", dtype=torch.bfloat16):
            general_norms[0] = 0
            got, expected = optimized(*inputs), model(*inputs)
        assert general_norms[0] > 0
    torch.testing.assert_close(got.float(), expected.float(), rtol=5e-2, atol=5e-2)


def test_a_norm_node_outside_a_guarded_forward_takes_the_general_call(general_norms: list[int]) -> None:
    _, optimized, inputs = _optimized_norms()
    with torch.no_grad():
        optimized(*inputs)
        node = _norm_nodes(optimized)[0]
        assert node._fast is not None and fast_calls.CHECKED.epoch == 0
        general_norms[0] = 0
        node(*inputs)
    assert general_norms[0] == 1


def test_a_copy_of_a_norm_node_makes_its_own_fast_call() -> None:
    _, optimized, inputs = _optimized_norms()
    with torch.no_grad():
        optimized(*inputs)
        copied = copy.deepcopy(optimized)
        assert all(n._fast is None for n in _norm_nodes(copied))
        torch.testing.assert_close(copied(*inputs), optimized(*inputs), rtol=0, atol=0)
        assert all(n._fast is not None and n._fast.node is n for n in _norm_nodes(copied))


def test_rows_read_where_they_lie_take_the_fast_call_at_their_strides(general_calls: list[int]) -> None:
    """A Linear on each sequence's first token (ViT's classifier: x[:, 0], rows apart) takes the fast call, the
    kernel reading the rows in place; the same rows at other strides are right too."""

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(8, 8)
            self.head = nn.Linear(8, 5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.proj(x)[:, 0])

    torch.manual_seed(0)
    model = Head().eval()
    x = torch.randn(3, 4, 8)
    optimized = ember.optimize(copy.deepcopy(model), graph_mode=True, sample_input=x)
    for _ in _fast_then(optimized, x, general_calls):
        _check(optimized, model, torch.randn(3, 4, 8))
    _check(optimized, model, torch.randn(3, 6, 8))  # the same [3, 8] rows at other strides
