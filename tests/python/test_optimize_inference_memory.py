"""What ember.optimize costs in memory for inference: the returned model shares the original's weights, weights
already in the compute dtype are read where they are, and the only copies are the caches the issue allows (bf16
copies of fp32 weights, blocked convolution weights, folded layers). Checked on the kernels' own byte counts and,
in a fresh process, on the resident set size."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import ember
from ember import _C
from ember._optimize.inference import linear
from ember._tensor import dlpack

BF16 = _C.Linear.supported("bfloat16")


def linear_kernel(module: nn.Module) -> _C.Linear:
    return module.forward.state.cache.kernel


def test_the_copy_shares_parameter_memory_but_not_parameter_objects() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 8)).eval()
    optimized = ember.optimize(model)
    for (name, p), (_, q) in zip(model.named_parameters(), optimized.named_parameters()):
        assert p.data_ptr() == q.data_ptr(), name
        assert p is not q and q.requires_grad == p.requires_grad
    for (name, b), (_, c) in zip(model.named_buffers(), optimized.named_buffers()):
        assert b.data_ptr() != c.data_ptr(), name  # train mode updates BatchNorm statistics in place
    optimized.double()  # replacing the copy's tensors leaves the original's
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(p.dtype == torch.float64 for p in optimized.parameters())


def test_tied_weights_stay_tied_in_the_copy() -> None:
    embedding = nn.Embedding(10, 6)
    head = nn.Linear(6, 10, bias=False)
    head.weight = embedding.weight
    model = nn.ModuleDict({"embedding": embedding, "head": head}).eval()
    optimized = ember.optimize(model)
    assert optimized["head"].weight is optimized["embedding"].weight
    assert optimized["head"].weight is not model["head"].weight


@pytest.mark.parametrize("rows", [3, 64])
def test_fp32_weights_run_in_place_without_a_copy(rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Where torch's fp32 matmul is MKL's on an Intel CPU, these small weights at 3 rows go to torch's kernel
    # (linear.prefers_torch); this test is about ember's kernel, so it runs them on ember's everywhere.
    monkeypatch.setattr(linear, "torch_fp32_matmul_is_mkl_on_intel", lambda: False)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32, bias=False)).eval()
    optimized = ember.optimize(model)
    x = torch.randn(rows, 64)
    with torch.no_grad():
        out = optimized(x)
        torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
        for layer in (optimized[0], optimized[2]):
            kernel = linear_kernel(layer)
            assert not kernel.prepack and kernel.packed_bytes() == 0
            # A few rows run on ember's skinny matmul, more on oneDNN's (on the same weight).
            skinny = kernel.implementation(rows, dlpack(layer.weight.detach())).startswith("ember:skinny:")
            assert skinny == (rows <= _C.Linear.skinny_rows("float32"))
        # In place means the kernel sees a write into the weight at once.
        optimized[2].weight.mul_(2)
        torch.testing.assert_close(optimized(x), 2 * out, rtol=1e-5, atol=1e-5)


def test_weights_prepack_true_packs_in_place_weights_too(capsys) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32, bias=False)).eval()
    x = torch.randn(64, 64)  # rows that run on oneDNN either way (a few fp32 rows on small weights go to torch)
    packed = ember.optimize(model, weights_prepack=True, report=True)
    assert "0.0 MiB read where they are" in capsys.readouterr().out
    in_place = ember.optimize(model)
    with torch.no_grad():
        torch.testing.assert_close(packed(x), model(x), rtol=1e-5, atol=1e-5)
        in_place(x)
    for layer in (packed[0], packed[2]):
        assert linear_kernel(layer).prepack and linear_kernel(layer).packed_bytes() > 0
    for layer in (in_place[0], in_place[2]):
        assert not linear_kernel(layer).prepack and linear_kernel(layer).packed_bytes() == 0


def test_a_folded_layer_is_packed_because_its_weights_are_new_numbers() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.BatchNorm1d(128), nn.ReLU()).eval()
    optimized = ember.optimize(model)
    with torch.no_grad():
        optimized(torch.randn(64, 64))
    kernel = linear_kernel(optimized[0])
    assert kernel.prepack and kernel.packed_bytes() >= 128 * 64 * 4


@pytest.mark.skipif(not BF16, reason="oneDNN has no bf16 matmul on this CPU")
@pytest.mark.parametrize("weights", [torch.float32, torch.bfloat16])
def test_bf16_compute_copies_only_fp32_weights(weights: torch.dtype) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU()).eval().to(weights)
    optimized = ember.optimize(model, dtype=torch.bfloat16)
    with torch.no_grad():
        optimized(torch.randn(64, 64))
    kernel = linear_kernel(optimized[0])
    if weights == torch.float32:
        assert kernel.prepack and kernel.packed_bytes() >= 128 * 64 * 2  # a bf16 copy: half the fp32 weight
        assert kernel.packed_bytes() < 128 * 64 * 4
    else:
        assert not kernel.prepack and kernel.packed_bytes() == 0


def test_the_report_says_what_the_weights_cost(capsys: pytest.CaptureFixture[str]) -> None:
    model = nn.Sequential(nn.Linear(1024, 1024), nn.Conv1d(4, 4, 3)).eval()
    ember.optimize(model, report=True)
    report = capsys.readouterr().out
    assert "weights: 4.0 MiB read where they are, 0.0 MiB to be packed in torch.float32" in report


# A fresh process measures its own resident set: 8 layers of 2048x2048 (128 MiB in fp32), run at 64 rows before
# and after optimizing. A small optimized model runs first, and the stock model before the measurement, so that
# what the process pays once (thread pools, JIT code, torch's allocator) is not counted against this model. The
# limits leave ~25 MiB for primitives, scratch and allocator slack; a packed copy would be 128 MiB (fp32).
_RSS_PROBE = textwrap.dedent(
    """
    import json, sys, torch, ember
    from torch import nn

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    compute = {"float32": torch.float32, "bfloat16": torch.bfloat16}[sys.argv[1]]
    weights = {"float32": torch.float32, "bfloat16": torch.bfloat16}[sys.argv[2]]
    torch.manual_seed(0)
    # What the process pays once, whatever it optimizes (libraries' thread pools, JIT code), is paid first.
    small = ember.optimize(nn.Sequential(nn.Linear(64, 64)).eval().to(weights), dtype=compute)
    with torch.no_grad():
        small(torch.randn(64, 64, dtype=weights))
        small(torch.randn(2, 64, dtype=weights))
    model = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(8)]).eval().to(weights)
    x = torch.randn(64, 2048, dtype=weights)
    with torch.no_grad():
        for _ in range(2):
            model(x)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    before = rss()
    model = ember.optimize(model, dtype=compute)
    with torch.no_grad():
        for _ in range(2):
            model(x)
    print(json.dumps({"weights": weight_bytes, "growth": rss() - before}))
    """
)


@pytest.mark.parametrize(
    ("compute", "weights", "allowed"),
    [
        ("float32", "float32", 0.2),  # in place: only primitives and scratch
        pytest.param(
            "bfloat16", "float32", 0.7, marks=pytest.mark.skipif(not BF16, reason="no bf16 matmul on this CPU")
        ),  # the bf16 copy: 0.5
        pytest.param(
            "bfloat16", "bfloat16", 0.2, marks=pytest.mark.skipif(not BF16, reason="no bf16 matmul on this CPU")
        ),
    ],
)
def test_optimizing_does_not_double_resident_memory(compute: str, weights: str, allowed: float) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _RSS_PROBE, compute, weights], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    growth = measured["growth"] / measured["weights"]
    assert growth < allowed, f"resident memory grew by {growth:.2f}x the weights (allowed {allowed})"


class _Kernel:
    """A stand-in kernel for SharedKernels' tests (which hold kernels weakly, as pybind11's classes allow)."""


def test_layers_built_from_the_same_tensors_share_one_kernel() -> None:
    """SharedKernels: one kernel per (tensors, way of building); another way, or other values, get their own."""
    from ember._optimize.inference.state import SharedKernels

    shared = SharedKernels()
    weight, bias = torch.randn(4, 3), torch.randn(4)
    built: list[_Kernel] = []

    def build() -> _Kernel:
        built.append(_Kernel())
        return built[-1]

    first = shared.get(("linear", 1), (weight, bias), build)
    assert shared.get(("linear", 1), (weight, bias), build) is first
    assert shared.get(("linear", 2), (weight, bias), build) is not first  # another way of building
    assert shared.get(("linear", 1), (weight, None), build) is not first  # other tensors
    assert len(built) == 3 and len(shared) == 3


def test_a_changed_weight_gets_a_new_shared_kernel_and_leaves_no_stale_one() -> None:
    from ember._optimize.inference.state import SharedKernels

    shared = SharedKernels()
    weight = torch.randn(4, 3)
    first = shared.get("config", (weight, None), _Kernel)
    with torch.no_grad():
        weight.mul_(2)  # (its version counter moves)
    second = shared.get("config", (weight, None), _Kernel)
    assert second is not first and len(shared) == 1
    weight.data = torch.randn(4, 3)  # (its memory moves)
    third = shared.get("config", (weight, None), _Kernel)
    assert third is not second and len(shared) == 1
    del weight
    assert len(shared) == 0  # a tensor that goes takes its kernels with it


def test_a_kernel_no_layer_holds_is_not_kept() -> None:
    """The registry holds kernels weakly: a compiled graph that goes frees its packed weights even while the
    model's parameters live on."""
    from ember._optimize.inference.state import SharedKernels

    shared = SharedKernels()
    weight = torch.randn(4, 3)
    kernel = shared.get("config", (weight, None), _Kernel)
    assert len(shared) == 1
    del kernel
    gc.collect()
    assert len(shared) == 0
    assert shared.get("config", (weight, None), _Kernel) is not None  # (built again when asked)


def test_a_tensor_freed_during_a_lookup_cannot_deadlock_it() -> None:
    """A garbage collection inside SharedKernels.get (which holds its lock) may free a tensor with kernels: its
    finalizer then runs on that thread, so it must not wait for the lock."""
    import threading

    from ember._optimize.inference.state import SharedKernels

    shared = SharedKernels()
    weight = torch.randn(4, 3)
    kernel = shared.get("config", (weight, None), _Kernel)

    def free_under_the_lock() -> None:
        nonlocal weight
        with shared._lock:  # as get() holds it
            del weight  # (the finalizer runs here)

    worker = threading.Thread(target=free_under_the_lock, daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), "the finalizer waited for the lock its own thread holds"
    assert len(shared) == 0 and kernel is not None
