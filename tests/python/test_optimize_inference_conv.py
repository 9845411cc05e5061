"""ember.optimize for inference, convolutions: every geometry against torch, BatchNorm folding and post-ops in
nn.Sequential and torchvision-style residual blocks, channels-last propagation, and the paths left to torch."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
from torch import nn

import ember
from ember import _C

BF16 = _C.Convolution.supported("bfloat16")


def close(a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-5) -> bool:
    scale = b.float().abs().max() + 1
    return bool(((a.float() - b.float()).abs() <= rtol * scale).all())


def conv_kernels(model: nn.Module) -> list[_C.Convolution]:
    return [
        m.forward.state.cache.kernel
        for m in model.modules()
        if "forward" in m.__dict__ and hasattr(m.forward, "geometry") and m.forward.state.cache.kernel is not None
    ]


def randomize_batchnorm(model: nn.Module) -> nn.Module:
    """Non-trivial running statistics and affine parameters, so that a wrong fold shows."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.5)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                if m.weight is not None:
                    m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                    m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.2)
    return model


GEOMETRIES = [
    (nn.Conv1d(4, 6, 3), (2, 4, 11)),
    (nn.Conv1d(4, 8, 5, stride=2, padding=3, dilation=2, groups=2, bias=False), (3, 4, 20)),
    (nn.Conv1d(4, 6, 4, padding="same", padding_mode="circular"), (2, 4, 9)),
    (nn.Conv2d(8, 16, 3, padding=1), (2, 8, 9, 7)),
    (nn.Conv2d(3, 8, 7, stride=2, padding=3), (1, 3, 23, 20)),
    (nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=16), (2, 16, 10, 11)),
    (nn.Conv2d(8, 12, (3, 2), padding=(2, 0), dilation=(2, 1), groups=4, padding_mode="reflect"), (1, 8, 9, 9)),
    (nn.Conv2d(6, 6, 4, padding="same", padding_mode="replicate", bias=False), (2, 6, 7, 8)),
    (nn.Conv2d(8, 8, 3, padding="valid"), (1, 8, 6, 6)),
    (nn.Conv3d(4, 6, 3, padding=1, stride=(1, 2, 2)), (1, 4, 5, 8, 8)),
    (nn.ConvTranspose1d(6, 4, 3, stride=2, padding=1, output_padding=1), (2, 6, 7)),
    (nn.ConvTranspose2d(8, 6, 3, stride=2, padding=1, output_padding=1), (2, 8, 5, 6)),
    (nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1, groups=2, dilation=2, bias=False), (1, 8, 6, 5)),
    (nn.ConvTranspose3d(4, 4, 2, stride=2), (1, 4, 3, 4, 3)),
]


@pytest.mark.parametrize("layer,shape", GEOMETRIES, ids=lambda v: repr(v) if isinstance(v, nn.Module) else None)
def test_every_geometry_matches_torch(layer: nn.Module, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    layer = copy.deepcopy(layer).eval()
    optimized = ember.optimize(layer)
    for batch in (shape[0], shape[0] + 2):  # a second batch size: a second primitive on the same packed copy
        x = torch.randn(batch, *shape[1:])
        with torch.no_grad():
            expected = layer(x)
            out = optimized(x)
        assert out.shape == expected.shape
        assert close(out, expected)
    (kernel,) = conv_kernels(optimized)
    assert kernel.cached_primitives() == 2
    if x.dim() >= 4:
        memory_format = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
        assert out.is_contiguous(memory_format=memory_format)


@pytest.mark.parametrize(
    "act",
    [nn.ReLU(), nn.GELU(), nn.SiLU(), nn.Sigmoid(), nn.Tanh(), nn.Hardswish(), nn.Hardsigmoid(), nn.ReLU6()],
    ids=repr,
)
def test_conv_batchnorm_activation_fuse_in_sequential(act: nn.Module) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False),
        nn.BatchNorm2d(16),
        act,
        nn.Dropout2d(0.1),
        nn.Conv2d(16, 8, 1),
        nn.BatchNorm2d(8),
        nn.Hardswish(),  # not a post-op: runs as torch's, after the fused conv+bn
    )
    model = randomize_batchnorm(model).eval()
    optimized = ember.optimize(model)
    assert "fused" in repr(optimized.forward)
    x = torch.randn(2, 3, 12, 10)
    with torch.no_grad():
        assert close(optimized(x), model(x))
    assert len(conv_kernels(optimized)) == 2
    assert optimized[0].forward.state.bn.running_mean.owner is optimized[1]


def test_conv1d_folds_batchnorm1d_and_keeps_its_layout() -> None:
    torch.manual_seed(0)
    model = randomize_batchnorm(nn.Sequential(nn.Conv1d(4, 8, 3), nn.BatchNorm1d(8), nn.ReLU())).eval()
    optimized = ember.optimize(model)
    x = torch.randn(3, 4, 16)
    with torch.no_grad():
        out = optimized(x)
        assert close(out, model(x))
    assert out.is_contiguous()  # code after a Conv1d often calls .view
    assert optimized[0].forward.state.bn.running_mean.owner is optimized[1]


def test_batchnorm_of_another_rank_is_not_folded() -> None:
    """A BatchNorm1d after a Conv2d raises in torch (wrong input rank): folding it would hide that."""
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm1d(4)).eval()
    optimized = ember.optimize(model)
    assert optimized[0].forward.state.bn is None
    with pytest.raises(ValueError), torch.no_grad():
        optimized(torch.randn(1, 3, 4, 4))


class Bottleneck(nn.Module):
    """torchvision's Bottleneck, as a container ember does not know: the convolutions run alone, unfused."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(16, 8, 1, bias=False), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + x)


def test_unknown_container_runs_each_convolution_alone() -> None:
    torch.manual_seed(0)
    model = randomize_batchnorm(Bottleneck()).eval()
    optimized = ember.optimize(model)
    x = torch.randn(2, 16, 8, 8)
    with torch.no_grad():
        assert close(optimized(x), model(x))
    assert all(m.forward.state.bn is None for m in (optimized.conv1, optimized.conv2))
    assert len(conv_kernels(optimized)) == 2


def test_state_dict_and_parameters_stay_plain() -> None:
    torch.manual_seed(0)
    model = randomize_batchnorm(nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimized = ember.optimize(model)
    with torch.no_grad():
        optimized(torch.randn(1, 3, 8, 8))
    after = optimized.state_dict()
    assert list(after) == list(before)
    for key, value in before.items():
        assert after[key].shape == value.shape and after[key].dtype == value.dtype
        assert torch.equal(after[key], value)
        assert torch.equal(model.state_dict()[key], value)  # the original, untouched
    assert [type(m) for m in optimized.modules()] == [type(m) for m in model.modules()]


def test_changed_batchnorm_statistics_rebuild_the_fold() -> None:
    torch.manual_seed(0)
    model = randomize_batchnorm(nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))).eval()
    optimized = ember.optimize(model)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        optimized(x)
        optimized[1].running_var.mul_(4)
        optimized[0].weight.add_(0.5)
        reference = copy.deepcopy(optimized)
        for m in reference.modules():
            m.__dict__.pop("forward", None)
        assert close(optimized(x), reference(x))


def test_a_replaced_weight_of_another_shape_gets_new_call_plans() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU()).eval()
    optimized = ember.optimize(model)
    x = torch.randn(2, 3, 8, 8)
    conv = optimized[0]
    with torch.no_grad():
        assert optimized(x).shape == (2, 8, 6, 6)
        conv.weight = nn.Parameter(torch.randn(5, 3, 3, 3))
        conv.bias = nn.Parameter(torch.randn(5))
        out = optimized(x)
        assert out.shape == (2, 5, 6, 6)
        assert close(out, torch.relu(torch.nn.functional.conv2d(x, conv.weight, conv.bias)))
        assert conv_kernels(optimized)[0].out_channels == 5


def test_train_mode_gets_torchs_gradients() -> None:
    torch.manual_seed(0)
    model = randomize_batchnorm(nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())).eval()
    optimized = ember.optimize(model)
    x = torch.randn(2, 3, 8, 8)
    for m in (model, optimized):
        m.train()
        m(x).square().sum().backward()
    for p, q in zip(model.parameters(), optimized.parameters()):
        assert torch.equal(p.grad, q.grad)
    # eval mode with autograd recording: torch's path too, so gradients still flow
    optimized.eval()
    optimized.zero_grad()
    optimized(x).sum().backward()
    assert optimized[0].weight.grad is not None


def test_transposed_with_output_size_and_unrepresentable_padding_run_on_torch(capsys) -> None:
    torch.manual_seed(0)
    up = nn.ConvTranspose2d(4, 4, 3, stride=2, padding=1).eval()
    optimized = ember.optimize(up)
    x = torch.randn(1, 4, 5, 5)
    with torch.no_grad():
        assert close(optimized(x, output_size=[10, 10]), up(x, output_size=[10, 10]))
    odd = nn.ConvTranspose2d(4, 4, 3, stride=3, padding=0, output_padding=1).eval()
    optimized = ember.optimize(odd, report=True)
    assert "output_padding exceeds padding" in capsys.readouterr().out
    assert "forward" not in optimized.__dict__
    with torch.no_grad():
        assert torch.equal(optimized(x), odd(x))


def test_other_dtypes_and_empty_batches() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    optimized = ember.optimize(model)
    with torch.no_grad():
        x64 = torch.randn(1, 3, 6, 6, dtype=torch.float64)
        assert optimized.double()(x64).dtype == torch.float64  # float64 is torch's to run
        optimized.float()
        empty = optimized(torch.randn(0, 3, 6, 6))
        assert empty.shape == (0, 4, 4, 4)
        with pytest.raises(RuntimeError):
            optimized(torch.randn(1, 5, 6, 6))  # torch's own error for the wrong channel count


def test_concurrent_calls_and_thread_counts() -> None:
    torch.manual_seed(0)
    model = randomize_batchnorm(nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.SiLU())).eval()
    optimized = ember.optimize(model)
    inputs = [torch.randn(2, 8, 10, 10) for _ in range(4)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            with torch.no_grad():
                for _ in range(5):
                    assert close(optimized(inputs[i]), expected[i])
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    saved = torch.get_num_threads()
    try:
        with torch.no_grad():
            for n in (1, saved):
                torch.set_num_threads(n)
                assert close(optimized(inputs[0]), expected[0])
    finally:
        torch.set_num_threads(saved)


@pytest.mark.skipif(not BF16, reason="oneDNN has no bf16 convolution on this CPU (needs AVX-512)")
def test_bf16_matches_autocast() -> None:
    # Tolerance: ember and autocast both compute in bf16 with fp32 accumulation; they round at different places
    # (ember folds BN before rounding the weights and applies the activation before rounding the output), a few
    # 2^-8 relative per layer, two layers.
    torch.manual_seed(0)
    model = randomize_batchnorm(
        nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 8, 3))
    ).eval()
    optimized = ember.optimize(model, dtype=torch.bfloat16)
    x = torch.randn(2, 3, 12, 12)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(x)
    with torch.no_grad():
        out = optimized(x)
    assert out.dtype == torch.bfloat16
    assert close(out, expected, rtol=4e-2)
    assert len(conv_kernels(optimized)) == 2
