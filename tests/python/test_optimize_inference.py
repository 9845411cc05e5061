"""ember.optimize for inference (a model in eval mode): outputs against stock PyTorch, the state that must not
change, the fast path's conditions, and the ways users call an optimized model (threads, copies, autocast)."""

from __future__ import annotations

import copy
import io
import threading
import warnings

import pytest
import torch
from torch import nn

import ember
from ember import _C
from ember._optimize import api as optimize_api

BF16 = _C.Linear.supported("bfloat16")
ACTIVATIONS = [
    nn.ReLU(),
    nn.GELU(),
    nn.GELU(approximate="tanh"),
    nn.SiLU(),
    nn.Sigmoid(),
    nn.Tanh(),
    nn.Hardswish(),
    nn.Hardsigmoid(),
    nn.ReLU6(),
]


def mlp(act: nn.Module | None = None, bn: bool = True) -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(48, 96)]
    if bn:
        layers.append(nn.BatchNorm1d(96))
    layers += [act if act is not None else nn.ReLU(), nn.Dropout(0.2), nn.Linear(96, 80, bias=False), nn.Tanh()]
    model = nn.Sequential(*layers)
    if bn:
        with torch.no_grad():
            model[1].running_mean.uniform_(-1, 1)
            model[1].running_var.uniform_(0.5, 2)
            model[1].weight.uniform_(0.5, 1.5)
            model[1].bias.uniform_(-0.5, 0.5)
    return model.eval()


def kernels(model: nn.Module) -> list[_C.Linear]:
    """The oneDNN layers the model has built so far."""
    return [
        m.forward.state.cache.kernel
        for m in model.modules()
        if "forward" in m.__dict__ and hasattr(m.forward, "state") and m.forward.state.cache.kernel is not None
    ]


def close(a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-5) -> bool:
    return bool(((a.float() - b.float()).abs() <= rtol * (b.float().abs() + 1)).all())


@pytest.mark.parametrize("act", ACTIVATIONS, ids=lambda a: repr(a))
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_fp32_matches_torch_for_each_activation(act: nn.Module, rows: int) -> None:
    model = mlp(act)
    optimized = ember.optimize(model)
    x = torch.randn(rows, 48)
    with torch.no_grad():
        assert close(optimized(x), model(x))
    if rows == 64:  # 1 and 5 rows of an fp32 layer this small are torch's to run (benchmarks/results/linear-*)
        assert len(kernels(optimized)) == 2


def test_leading_dimensions_and_dynamic_shapes() -> None:
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 16)).eval()
    optimized = ember.optimize(model)
    with torch.no_grad():
        for shape in [(2, 40, 32), (7, 32), (3, 5, 11, 32), (0, 32), (1, 100, 32)]:
            x = torch.randn(shape)
            out = optimized(x)
            assert out.shape == (*shape[:-1], 16)
            assert close(out, model(x))
        transposed = torch.randn(32, 50).t()  # rows with stride 1: copied into a row-major input
        assert close(optimized(transposed), model(transposed))
        for x in (
            torch.randn(32),  # one row, as nn.Linear takes it
            torch.randn(40, 2, 32).transpose(0, 1),  # leading dimensions out of order: copied
            torch.randn(2, 40, 48)[..., :32],  # padded rows: not contiguous, copied
        ):
            out = optimized(x)
            assert out.shape == (*x.shape[:-1], 16)
            assert close(out, model(x))
    assert kernels(optimized)[0].cached_primitives() >= 3


def test_the_router_names_the_kernel_each_call_runs_on() -> None:
    """_C.Linear.route is the one question the Linear plan asks (csrc/linear/linear_route.h holds the rules, tested
    in tests/cpp/test_linear_route.cpp): it names the kernel the layer's implementation() reports, torch's where
    the plan leaves the call to torch, and refuses bad questions with torch's exception types."""
    from ember._optimize.inference import linear
    from ember._tensor import dlpack

    weight = torch.randn(48, 300)  # wider than tall: the transposed matmul's shape in fp32
    layer = _C.Linear(dlpack(weight), None, "float32", False)
    for rows in (1, 8, 9, 256, 257):
        kernel = _C.Linear.route("float32", rows, dlpack(weight), True, False)
        name = layer.implementation(rows, dlpack(weight))
        assert kernel in ("skinny", "swapped", "onednn"), (rows, kernel)
        assert name.startswith("ember:skinny:") == (kernel == "skinny"), (rows, name)
        assert name.endswith("(swapped)") == (kernel == "swapped"), (rows, name)
    assert _C.Linear.route("float32", 1, dlpack(weight), True, True) == "caller"  # a tiny weight: MKL's on Intel
    assert _C.Linear.route("float32", 1, dlpack(weight.t()), True, False) == "onednn"  # K-major: no skinny matmul
    optimized = ember.optimize(nn.Linear(300, 48).eval())
    with torch.no_grad():
        optimized(torch.randn(1, 300))
    caller = _C.Linear.route("float32", 1, dlpack(weight), True, linear.torch_fp32_matmul_is_mkl_on_intel()) == "caller"
    assert [plan.torch for plan in optimized.forward.state.cache.plans.values()] == [caller]
    for args, error, message in (
        (("float32", 0, dlpack(weight), True, False), ValueError, "rows must be >= 1"),
        (("float64", 1, dlpack(weight), True, False), TypeError, "compute must be 'float32', 'bfloat16' or 'float16'"),
        (("bfloat16", 1, dlpack(weight), True, False), TypeError, "compute dtype"),
        (("float32", 1, dlpack(torch.randn(5)), True, False), ValueError, "out_features, in_features"),
    ):
        with pytest.raises(error, match=message):
            _C.Linear.route(*args)


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors is a no-op")  # torch, making such a layer
@pytest.mark.parametrize("in_features, out_features, rows", [(0, 5, 3), (5, 0, 3), (5, 4, 0)])
def test_empty_layers_and_inputs_give_torchs_result(in_features: int, out_features: int, rows: int) -> None:
    """A Linear with no inputs or no outputs, or an input of no rows, computes what torch does (the bias, or an
    empty tensor) instead of failing in the plan."""
    torch.manual_seed(0)
    layer = nn.Linear(in_features, out_features).eval()
    optimized = ember.optimize(copy.deepcopy(layer))
    x = torch.randn(rows, in_features)
    with torch.no_grad():
        assert torch.equal(optimized(x), layer(x))


def test_kernel_reads_leading_dimensions_as_rows() -> None:
    """_C.Linear.forward takes [..., K] tensors whose leading dimensions flatten without a copy, and refuses other
    layouts, or an out of other leading dimensions, before writing anything."""
    from ember._tensor import dlpack

    torch.manual_seed(0)
    weight, bias = torch.randn(24, 32), torch.randn(24)
    layer = _C.Linear(dlpack(weight), dlpack(bias), "float32", False)
    x = torch.randn(3, 20, 32)
    out = torch.empty(3, 20, 24)
    layer.forward(dlpack(x), dlpack(weight), dlpack(out))
    assert close(out, torch.nn.functional.linear(x, weight, bias))
    for bad_x, bad_out, message in (
        (torch.randn(20, 3, 32).transpose(0, 1), torch.empty(3, 20, 24), "flatten into rows without a copy"),
        (x, torch.empty(20, 3, 24), "leading dimensions of x"),
        (x, torch.empty(60, 24), "leading dimensions of x"),
    ):
        bad_out.fill_(7.0)
        with pytest.raises(ValueError, match=message):
            layer.forward(dlpack(bad_x), dlpack(weight), dlpack(bad_out))
        assert bool((bad_out == 7.0).all())


@pytest.mark.skipif(not BF16, reason="oneDNN has no bf16 matmul on this CPU (needs AVX-512)")
@pytest.mark.parametrize("rows", [1, 64])
def test_bf16_matches_autocast(rows: int) -> None:
    # Tolerance: both round activations and weights to bf16 (8 bits of mantissa) and accumulate in fp32; they
    # differ in where torch rounds intermediate results (after the matmul, before BN and the activation; ember
    # folds BN first and applies activations in fp32). Three layers of bf16 rounding give a few 2^-8 relative.
    model = mlp()
    optimized = ember.optimize(model, dtype=torch.bfloat16)
    x = torch.randn(rows, 48)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(x)
    with torch.no_grad():
        out = optimized(x)
    assert out.dtype == torch.bfloat16
    assert close(out, expected, rtol=4e-2)
    assert len(kernels(optimized)) == 2


def test_bf16_model_runs_where_onednn_has_no_bf16() -> None:
    """On a CPU without oneDNN's bf16 matmul the layers stay torch's, and the model still runs under autocast."""
    model = mlp()
    optimized = ember.optimize(model, dtype=torch.bfloat16)
    x = torch.randn(16, 48)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(x)
    with torch.no_grad():
        out = optimized(x)
        inside_autocast = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            inside_autocast = optimized(x)
    assert close(out, expected, rtol=4e-2)
    assert close(inside_autocast, out, rtol=1e-6)


@pytest.mark.parametrize("arithmetic", [True, False], ids=["a bf16 CPU", "an AVX2-only CPU"])
def test_bf16_on_a_cpu_without_bf16_arithmetic_says_float32_is_faster(
    arithmetic: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Emulated bf16 was 5-30x slower than fp32 on an AVX2 EPYC: the call says so, at the caller's line, for
    inference and training alike; fp32 never warns."""
    monkeypatch.setattr(optimize_api, "has_bf16_arithmetic", lambda: arithmetic)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ember.optimize(mlp(), dtype=torch.bfloat16)
        training = mlp().train()
        ember.optimize(training, optimizer=torch.optim.SGD(training.parameters(), lr=0.1), dtype=torch.bfloat16)
        ember.optimize(mlp(), dtype=torch.float32)
    emulated = [w for w in caught if "no bfloat16 arithmetic" in str(w.message)]
    assert len(emulated) == (0 if arithmetic else 2)
    for w in emulated:
        assert w.filename == __file__ and "dtype=torch.float32" in str(w.message)


def test_the_bf16_arithmetic_probe_matches_the_cpu() -> None:
    features = _C.cpu_features()
    if features["avx512_bf16"] or (features["amx_bf16"] and features["amx_permitted"]):
        assert optimize_api.has_bf16_arithmetic()
    if not features["avx512f"]:
        assert not optimize_api.has_bf16_arithmetic()


def test_state_stays_plain_and_the_original_intact() -> None:
    model = mlp()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimized = ember.optimize(model, sample_input=torch.randn(32, 48))
    assert optimized is not model
    assert "forward" not in model[0].__dict__  # the original has no ember forward
    for key, value in optimized.state_dict().items():
        assert torch.equal(value, before[key]) and value.dtype == before[key].dtype
    assert list(optimized.state_dict()) == list(before)
    assert [type(m) for m in optimized.modules()] == [type(m) for m in model.modules()]
    assert [(n, p.shape, p.dtype) for n, p in optimized.named_parameters()] == [
        (n, p.shape, p.dtype) for n, p in model.named_parameters()
    ]
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key])
    same = ember.optimize(model, inplace=True)
    assert same is model and "forward" in model[0].__dict__


def test_a_stock_checkpoint_loads_and_replaces_the_cache() -> None:
    model = mlp()
    optimized = ember.optimize(model)
    x = torch.randn(64, 48)
    with torch.no_grad():
        optimized(x)
    other = mlp()
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(1.5)
    optimized.load_state_dict(other.state_dict())
    with torch.no_grad():
        assert close(optimized(x), other(x))
        optimized[0].weight.mul_(0.5)  # an in-place change is seen too
        other[0].weight.mul_(0.5)
        assert close(optimized(x), other(x))


def test_a_model_built_under_inference_mode_builds_its_kernel_once() -> None:
    """Inference tensors have no version counter: the cache marks them as such, asks rather than catching torch's
    error on every call (~30 us a tensor), and keeps its kernel while they stay the same tensors."""
    with torch.inference_mode():
        model = mlp()
        assert model[0].weight.is_inference()
        optimized = ember.optimize(model)
        x = torch.randn(64, 48)
        first = optimized(x)
        built = kernels(optimized)
        assert close(optimized(x), first)
        assert [a is b for a, b in zip(kernels(optimized), built)] == [True] * len(built)
        optimized[0].weight = model[0].weight = nn.Parameter(torch.randn(96, 48))  # another tensor: rebuilt
        assert close(optimized(x), model(x))
        assert kernels(optimized)[0] is not built[0]


def test_a_replaced_weight_of_another_shape_gets_new_call_plans() -> None:
    """A layer decides once per input signature what a call does (its plans); replacing the weight, even by one of
    another shape, drops those decisions with the kernel."""
    model = nn.Sequential(nn.Linear(48, 96), nn.ReLU()).eval()
    optimized = ember.optimize(model)
    x = torch.randn(3, 20, 48)
    layer = optimized[0]
    with torch.no_grad():
        assert optimized(x).shape == (3, 20, 96)
        layer.weight = nn.Parameter(torch.randn(30, 48))
        layer.bias = nn.Parameter(torch.randn(30))
        out = optimized(x)
        assert out.shape == (3, 20, 30)
        assert close(out, torch.relu(torch.nn.functional.linear(x, layer.weight, layer.bias)))
        layer.bias = None
        assert close(optimized(x), torch.relu(torch.nn.functional.linear(x, layer.weight)))
        assert kernels(optimized)[0].out_features == 30


def test_call_plans_follow_dtype_and_autocast_and_stay_bounded() -> None:
    """Same shape, another dtype: a plan per dtype (an fp32 layer refuses bf16 inputs exactly as torch does).
    Autocast is read on every call. Many distinct shapes start the memo afresh rather than growing it."""
    model = nn.Sequential(nn.Linear(16, 8)).eval()
    optimized = ember.optimize(model)
    x = torch.randn(64, 16)
    with torch.no_grad():
        assert close(optimized(x), model(x))
        for net in (model, optimized):
            with pytest.raises(RuntimeError):
                net(x.bfloat16())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            inside = optimized(x)
            assert inside.dtype == torch.bfloat16
            assert torch.equal(inside, model(x))
        assert optimized(x).dtype == torch.float32
        state = optimized[0].forward.state
        limit = type(state.cache).MAX_PLANS
        for rows in range(1, limit + 40):
            xr = torch.randn(rows, 16)
            assert close(optimized(xr), model(xr))
            assert len(state.cache.plans) <= limit


def test_train_mode_and_autograd_get_torchs_gradients() -> None:
    model = mlp()
    optimized = ember.optimize(model)
    x = torch.randn(64, 48)
    for train in (True, False):
        model.train(train)
        optimized.train(train)
        torch.manual_seed(1)
        model(x).square().sum().backward()
        torch.manual_seed(1)
        optimized(x).square().sum().backward()
        for p, q in zip(model.parameters(), optimized.parameters()):
            assert torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-6)
            p.grad = q.grad = None
    assert kernels(optimized) == []  # autograd was recording every time: nothing ran on the kernel


def test_shapes_left_to_torch_run_its_forward_with_its_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    """An input the plan leaves to torch (two rows of a small fp32 weight, where torch's fp32 matmul is MKL's on an
    Intel CPU: made so here) goes straight to F.linear, in eval mode and afterwards in train mode with autograd: the
    stock module's values and gradients."""
    from ember._optimize.inference import linear

    monkeypatch.setattr(linear, "torch_fp32_matmul_is_mkl_on_intel", lambda: True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(48, 96)).eval()
    optimized = ember.optimize(model)
    x = torch.randn(2, 48)
    with torch.no_grad():
        assert torch.equal(optimized(x), model(x))
    plans = optimized[0].forward.state.cache.plans
    assert [p.torch for p in plans.values()] == [True]
    assert kernels(optimized) == []
    for net in (model, optimized):
        net.train()
        net(x).square().sum().backward()
    assert torch.equal(optimized[0].weight.grad, model[0].weight.grad)
    assert torch.equal(optimized[0].bias.grad, model[0].bias.grad)


@pytest.mark.parametrize("mkl_on_intel", [True, False])
def test_fp32_calls_go_to_torch_only_where_its_kernel_was_measured_faster(
    monkeypatch: pytest.MonkeyPatch, mkl_on_intel: bool
) -> None:
    """The fp32 shapes sent to torch (1-8 rows of weights under 1M elements, 2 and 5-8 rows under 4M) are sent
    there only where torch's fp32 matmul is MKL's on an Intel CPU; elsewhere ember's kernel runs them. Either way
    the values are torch's to fp32 rounding."""
    from ember._optimize.inference import linear

    monkeypatch.setattr(linear, "torch_fp32_matmul_is_mkl_on_intel", lambda: mkl_on_intel)
    torch.manual_seed(0)
    tiny, small = nn.Linear(64, 48).eval(), nn.Linear(1024, 1100).eval()  # 3K and 1.1M weights
    cases = [(tiny, rows, mkl_on_intel) for rows in (1, 2, 3, 4, 8)]
    cases += [(small, 2, mkl_on_intel), (small, 6, mkl_on_intel), (small, 3, False), (small, 4, False)]
    cases += [(small, 1, False)]  # one row of it runs on ember's skinny matmul everywhere ...
    for layer, rows, to_torch in cases:
        optimized = ember.optimize(layer)
        x = torch.randn(rows, layer.in_features)
        with torch.no_grad():
            out = optimized(x)
            assert close(out, layer(x))
        plans = list(optimized.forward.state.cache.plans.values())
        assert [p.torch for p in plans] == [to_torch], (layer, rows)
    packed = ember.optimize(small, weights_prepack=True)  # ... and on a packed copy (oneDNN's) unless MKL's is
    x = torch.randn(1, 1024)
    with torch.no_grad():
        assert close(packed(x), small(x))
    assert [p.torch for p in packed.forward.state.cache.plans.values()] == [mkl_on_intel]


def test_thread_count_changes_nothing() -> None:
    model = mlp()
    optimized = ember.optimize(model)
    x = torch.randn(128, 48)
    saved = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2, saved):
            torch.set_num_threads(threads)
            with torch.no_grad():
                outs.append(optimized(x))
    finally:
        torch.set_num_threads(saved)
    for out in outs[1:]:
        assert close(out, outs[0], rtol=1e-6)


def test_concurrent_calls_from_python_threads() -> None:
    model = mlp()
    optimized = ember.optimize(model)
    inputs = [torch.randn(rows, 48) for rows in (16, 33, 64, 200, 16, 64, 9, 128)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    results: dict[int, torch.Tensor] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            with torch.no_grad():
                for _ in range(5):
                    results[i] = optimized(inputs[i])
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, exp in enumerate(expected):
        assert close(results[i], exp)


def test_deepcopy_and_torch_save() -> None:
    model = mlp()
    optimized = ember.optimize(model, sample_input=torch.randn(64, 48))
    x = torch.randn(64, 48)
    buffer = io.BytesIO()
    torch.save(optimized, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False) if "weights_only" in torch.load.__code__.co_varnames else None
    if loaded is None:
        buffer.seek(0)
        loaded = torch.load(buffer)
    for clone in (copy.deepcopy(optimized), loaded):
        assert kernels(clone) == []  # the cache is not copied
        with torch.no_grad():
            assert close(clone(x), model(x))
        assert clone[0].forward.module is clone[0]
        assert clone[0].forward.state.bn.running_mean.owner is clone[1]


def test_report_and_left_alone(capsys: pytest.CaptureFixture[str]) -> None:
    class MyLinear(nn.Linear):
        pass

    model = nn.Sequential(nn.Linear(8, 8), MyLinear(8, 8), nn.Dropout()).eval()
    ember.optimize(model, report=True)
    out = capsys.readouterr().out
    assert "Linear layer(s) run in torch.float32 on ember" in out
    assert "MyLinear subclasses nn.Linear" in out
    assert "dropout module(s) are the identity" in out


def test_levels_and_flags() -> None:
    model = mlp()
    o0 = ember.optimize(model, level="O0")
    assert not any("forward" in m.__dict__ for m in o0.modules())
    no_pack = ember.optimize(model, weights_prepack=False)
    assert "forward" not in no_pack[0].__dict__ and "forward" not in no_pack.__dict__
    no_fold = ember.optimize(model, linear_bn_folding=False)
    assert no_fold[0].forward.state.bn is None
    x = torch.randn(64, 48)
    with torch.no_grad():
        assert close(no_fold(x), model(x))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"level": "O2"}, ValueError, "level must be"),
        ({"dtype": torch.float64}, ValueError, "dtype must be"),
        ({"channels_last": True}, ValueError, "apply to training"),
        ({"weights_prepack": 1}, TypeError, "weights_prepack must be"),
        ({"optimizer": "sgd"}, ValueError, "optimizer was given"),
    ],
)
def test_refusals(kwargs: dict, error: type, message: str) -> None:
    model = mlp()
    with pytest.raises(error, match=message):
        ember.optimize(model, **kwargs)
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_transformer_encoder_under_bf16_autocast() -> None:
    """torch 1.13's fused encoder kernel fails under CPU autocast; the optimized model must not."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    optimized = ember.optimize(model, dtype=torch.bfloat16)
    x = torch.randn(2, 10, 32)
    with torch.no_grad():
        out = optimized(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            again = optimized(x)
        expected = model(x)
    assert out.shape == expected.shape and torch.isfinite(out.float()).all()
    assert close(again, out, rtol=1e-6)
    assert close(out, expected, rtol=1e-1)


@pytest.mark.parametrize("shape", [(0, 5), (7,), (3, 128, 768), (2, 33, 17)])
def test_fp32_input_of_a_bf16_layer_is_rounded_as_torch_rounds(shape: tuple[int, ...]) -> None:
    """in_compute_dtype's conversion (an fp32 input of a bf16 layer, on every machine; the layers reach it only where
    oneDNN has bf16): bit for bit torch's rounding, special values included; NaN stays NaN (torch's is one canonical
    NaN)."""
    from ember._optimize.inference.common import in_compute_dtype

    gen = torch.Generator().manual_seed(len(shape))
    x = torch.randn(shape, generator=gen) * 1e3
    flat = x.view(-1)
    specials = torch.tensor([float("inf"), -float("inf"), -0.0, 1e-40, -3e-39, 3.4e38, 1.0 + 2**-8, float("nan")])
    flat[: min(flat.numel(), specials.numel())] = specials[: flat.numel()]
    got, want = in_compute_dtype(x, True, torch.bfloat16), x.to(torch.bfloat16)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape and got.is_contiguous()
    nan = x.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got.view(torch.int16)[~nan], want.view(torch.int16)[~nan])


def _cpu_autocast_state() -> tuple[bool, torch.dtype]:
    from ember._optimize.inference.common import cpu_autocast_enabled

    get_dtype = getattr(torch, "get_autocast_dtype", None)
    return cpu_autocast_enabled(), get_dtype("cpu") if get_dtype else torch.get_autocast_cpu_dtype()


class _AutocastProbe(nn.Module):
    """Records the autocast state its forward runs under, before and after calling ``inner``; raises on request."""

    def __init__(self, inner: nn.Module | None = None) -> None:
        super().__init__()
        self.inner = inner
        self.seen: list[tuple[bool, torch.dtype]] = []

    def forward(self, x: torch.Tensor, fail: bool = False) -> torch.Tensor:
        self.seen.append(_cpu_autocast_state())
        if self.inner is None:
            if fail:
                raise ValueError("probe failed")
            return x * 2
        y = self.inner(x, fail)
        self.seen.append(_cpu_autocast_state())
        return y


def test_autocast_forwards_reuse_their_contexts_and_restore_torchs_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """ember's forwards reuse torch.autocast objects (one per thread and nesting level, as building one costs up to
    24 µs under torch 1.13) and leave torch's autocast state as they found it: around a model, a model nested in
    another with its own forward, a raising call, the user's own autocast block, and calls from several threads."""
    from ember._optimize.autocast_forward import AutocastForward, Float32Forward

    built: list[int] = []

    class CountingAutocast(torch.autocast):  # type: ignore[misc, name-defined]
        def __init__(self, *args: object, **kwargs: object) -> None:
            built.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(torch, "autocast", CountingAutocast)
    leaf = _AutocastProbe()
    leaf.__dict__["forward"] = Float32Forward(leaf)
    middle = _AutocastProbe(leaf)
    middle.__dict__["forward"] = AutocastForward(middle, torch.bfloat16)
    outer = _AutocastProbe(middle)  # the same kind of forward, nested: it needs a second object
    outer.__dict__["forward"] = AutocastForward(outer, torch.bfloat16)
    before = _cpu_autocast_state()
    x = torch.ones(3)
    for _ in range(10):
        assert torch.equal(outer(x), x * 2)
        assert _cpu_autocast_state() == before
    assert len(built) <= 3  # at most one per nesting level and kind, whatever the number of calls
    assert outer.seen[:2] == [(True, torch.bfloat16)] * 2 and middle.seen[:2] == [(True, torch.bfloat16)] * 2
    assert not leaf.seen[0][0]  # Float32Forward turns autocast off inside

    with pytest.raises(ValueError, match="probe failed"):
        outer(x, True)
    assert _cpu_autocast_state() == before
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = _cpu_autocast_state()
        outer(x)
        assert _cpu_autocast_state() == inside

    errors: list[BaseException] = []
    after: list[tuple[bool, torch.dtype]] = []

    def work() -> None:
        try:
            start = _cpu_autocast_state()
            for _ in range(50):
                assert torch.equal(outer(x), x * 2)
            after.append(_cpu_autocast_state())
            assert after[-1] == start
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(after) == 4
    assert _cpu_autocast_state() == before
