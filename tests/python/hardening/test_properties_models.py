"""ember.optimize on small random models: the optimized model returns what the original returns, in the dtype stock
PyTorch returns (eager for fp32, autocast's for bf16), through copies, from many threads at once, and without
growing memory."""

from __future__ import annotations

import copy
import gc
import io
import os
import threading

import pytest
import torch
from fuzz import EXAMPLES
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import ember

_BF16 = ember._C.Linear.supported("bfloat16") and ember._C.Convolution.supported("bfloat16")
_DTYPES = [torch.float32, torch.bfloat16] if _BF16 else [torch.float32]


@st.composite
def mlps(draw):
    """A Sequential of Linear layers with BatchNorm1d, activations and dropouts between them, and its input."""
    width = draw(st.integers(1, 40))
    layers: list[nn.Module] = []
    for _ in range(draw(st.integers(1, 3))):
        out = draw(st.integers(1, 40))
        layers.append(nn.Linear(width, out, bias=draw(st.booleans())))
        if draw(st.booleans()):
            layers.append(nn.BatchNorm1d(out))
        act = draw(st.sampled_from([None, nn.ReLU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Hardswish, nn.ReLU6]))
        if act is not None:
            layers.append(act())
        if draw(st.booleans()):
            layers.append(nn.Dropout(0.3))
        width = out
    rows = draw(st.sampled_from([1, 2, 3, 8, 33]))
    return nn.Sequential(*layers), (rows, layers[0].in_features)


@st.composite
def cnns(draw):
    """Conv2d / BatchNorm2d / activation stacks, and the input shape."""
    channels = draw(st.integers(1, 6))
    layers: list[nn.Module] = []
    for _ in range(draw(st.integers(1, 3))):
        out = draw(st.integers(1, 8))
        kernel = draw(st.sampled_from([1, 3]))
        layers.append(nn.Conv2d(channels, out, kernel, padding=draw(st.sampled_from([0, kernel // 2]))))
        if draw(st.booleans()):
            layers.append(nn.BatchNorm2d(out))
        act = draw(st.sampled_from([None, nn.ReLU, nn.GELU, nn.SiLU, nn.Hardsigmoid]))
        if act is not None:
            layers.append(act())
        channels = out
    return nn.Sequential(*layers), (draw(st.integers(1, 3)), layers[0].in_channels, 7, 7)


def _randomized(model: nn.Module) -> nn.Module:
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    return model.eval()


def _stock(model: nn.Module, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    with torch.no_grad():
        if dtype == torch.bfloat16:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return model(x)
        return model(x)


@pytest.mark.parametrize("dtype", _DTYPES)
@given(case=st.one_of(mlps(), cnns()), data=st.data())
def test_an_optimized_model_returns_stock_results_and_dtypes(case, data, dtype):
    model, shape = case
    model = _randomized(model)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    if data.draw(st.booleans(), label="channels_last") and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    expected = _stock(model, x, dtype)
    optimized = ember.optimize(model, dtype=dtype)
    with torch.no_grad():
        got = optimized(x)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)

    copied = copy.deepcopy(optimized)
    buffer = io.BytesIO()
    torch.save(optimized, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False) if "weights_only" in torch.load.__code__.co_varnames else (
        torch.load(buffer))  # fmt: skip
    for twin in (copied, loaded):
        forward = twin.__dict__.get("forward")
        inner = getattr(forward, "inner", forward)  # bf16: the autocast forward wraps the Sequential's
        if inner is not None and hasattr(inner, "_intact"):
            assert inner._intact(), "a copy lost the fused path"
        with torch.no_grad():
            torch.testing.assert_close(twin(x), got, atol=0, rtol=0)


def test_an_optimized_model_from_eight_threads_gives_the_serial_results():
    torch.manual_seed(0)
    model = _randomized(nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                                      nn.Linear(8 * 6 * 6, 16), nn.GELU(), nn.Linear(16, 4)))  # fmt: skip
    optimized = ember.optimize(model, dtype=torch.float32)
    inputs = [torch.randn(b, 3, 8, 8) for b in (1, 2, 3, 5, 8, 13, 1, 4)]
    with torch.no_grad():
        serial = [optimized(x) for x in inputs]
    results: list[list[torch.Tensor]] = [[] for _ in inputs]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            with torch.no_grad():
                for _ in range(20):
                    results[i].append(optimized(inputs[i]))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i, outs in enumerate(results):
        for out in outs:
            torch.testing.assert_close(out, serial[i], atol=0, rtol=0)


def _rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# CI runs a few thousand calls (EMBER_FUZZ_EXAMPLES scales the count; 10,000 in a long run, as the issue asks).
_CALLS = max(2000, min(10_000, EXAMPLES * 80))


@pytest.mark.skipif("libasan" in os.environ.get("LD_PRELOAD", ""), reason="ASan's quarantine holds freed memory")
def test_memory_stays_flat_over_many_inference_calls_and_optimizer_steps():
    torch.manual_seed(0)
    model = _randomized(nn.Sequential(nn.Linear(64, 128), nn.BatchNorm1d(128), nn.ReLU(), nn.Linear(128, 8)))
    optimized = ember.optimize(model, dtype=torch.float32)
    x = torch.randn(16, 64)
    with torch.no_grad():
        for _ in range(200):  # warm: kernels built, plans made, allocator pools grown
            optimized(x)
        gc.collect()
        before = _rss_bytes()
        for _ in range(_CALLS):
            optimized(x)
        gc.collect()
        grown = _rss_bytes() - before
    assert grown < 8 * 2**20, f"RSS grew {grown / 2**20:.1f} MiB over {_CALLS} inference calls"

    trained = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8))
    optimizer = ember.optim.AdamW(trained.parameters(), lr=1e-3)
    for p in trained.parameters():
        p.grad = torch.randn_like(p)
    for _ in range(200):
        optimizer.step()
    gc.collect()
    before = _rss_bytes()
    for _ in range(_CALLS):
        optimizer.step()
    gc.collect()
    grown = _rss_bytes() - before
    assert grown < 8 * 2**20, f"RSS grew {grown / 2**20:.1f} MiB over {_CALLS} optimizer steps"


def _without_dropout(model: nn.Sequential) -> nn.Sequential:
    # ember's dropout draws other masks than torch's: a training comparison keeps the deterministic layers only
    return nn.Sequential(*(m for m in model if not isinstance(m, nn.Dropout)))


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, bf16: bool) -> None:
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = model(x).float().square().mean()
    loss.backward()
    optimizer.step()


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("optimizer_name", ["SGD", "AdamW"])
@given(case=st.one_of(mlps(), cnns()))
def test_training_tracks_stock_pytorch_and_checkpoints_round_trip(case, optimizer_name, dtype):
    pristine, shape = case  # hypothesis may draw the same model object again: it stays untrained
    model = _without_dropout(copy.deepcopy(pristine)).train()
    if shape[0] == 1 and any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model):
        return  # torch refuses batch statistics of one sample per channel, before ember is involved
    bf16 = dtype == torch.bfloat16
    make = getattr(torch.optim, optimizer_name)
    stock = copy.deepcopy(model)
    stock_optimizer = make(stock.parameters(), lr=0.01)
    ours, optimizer = ember.optimize(model, optimizer=make(model.parameters(), lr=0.01), dtype=dtype)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        _train(stock, stock_optimizer, x, bf16)
        _train(ours, optimizer, x, bf16)
    # AdamW steps every parameter by about lr whatever its gradient's size, so one whose true gradient is 0 or
    # tiny (a bias before a BatchNorm, a saturated unit) moves by the sign of rounding noise: within 2 steps of lr.
    tol = 2 * 2 * 0.01 if optimizer_name == "AdamW" else (2e-2 if bf16 else 1e-4)
    state, stock_state = ours.state_dict(), stock.state_dict()
    assert list(state) == list(stock_state)
    for key, value in state.items():
        assert value.dtype == stock_state[key].dtype and value.shape == stock_state[key].shape, key
        torch.testing.assert_close(value, stock_state[key], atol=tol, rtol=tol, msg=key)

    # The checkpoint is plain PyTorch (a stock optimizer takes it) and restores ember's training byte for byte.
    buffer = io.BytesIO()
    torch.save({"model": ours.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer)
    make(copy.deepcopy(stock).parameters(), lr=0.01).load_state_dict(checkpoint["optimizer"])
    fresh = _without_dropout(copy.deepcopy(pristine)).train()
    fresh.load_state_dict(checkpoint["model"])
    resumed, resumed_optimizer = ember.optimize(fresh, optimizer=make(fresh.parameters(), lr=0.01), dtype=dtype)
    resumed_optimizer.load_state_dict(checkpoint["optimizer"])
    _train(ours, optimizer, x, bf16)
    _train(resumed, resumed_optimizer, x, bf16)
    for (key, a), b in zip(ours.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), f"{key} differs after resuming from the checkpoint"
