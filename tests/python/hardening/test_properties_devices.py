"""torch's device rule on every torch.ops.ember operator: all-meta calls give meta results of the CPU call's shapes
and dtypes (the fake kernel), and any mix of meta and CPU tensors raises "expected all tensors to be on the same
device" naming an argument, before anything is written."""

from __future__ import annotations

import pytest
import torch
from fuzz import call_or_refuse
from hypothesis import given
from hypothesis import strategies as st

import ember


def _calls() -> dict[str, tuple]:
    """A valid CPU call of each operator: (operator, arguments)."""
    g = torch.Generator().manual_seed(0)
    ops = torch.ops.ember
    w = [torch.randn(10, 4, generator=g), torch.randn(7, 4, generator=g)]
    idx = [torch.tensor([1, 2, 3]), torch.tensor([0, 6])]
    off = [torch.tensor([0, 2]), torch.tensor([0, 1])]
    none = torch.empty(0, 0)
    psw = [none, none]
    grads = [torch.randn(2, 4, generator=g), torch.randn(2, 4, generator=g)]
    x = torch.randn(2, 3, 5, 5, generator=g)
    buffers = [torch.rand(3, generator=g) + 0.5 for _ in range(4)]
    rois = torch.tensor([[0, 0.5, 0.5, 3.0, 4.0], [1, 1.0, 0.0, 4.0, 2.0]])
    return {
        "frozen_batch_norm": (ops.frozen_batch_norm, (x, *buffers, 1e-5)),
        "frozen_batch_norm_backward": (ops.frozen_batch_norm_backward, (x, buffers[0], buffers[3], 1e-5)),
        "interaction": (ops.interaction, ([torch.randn(2, 4, generator=g) for _ in range(3)],)),
        "interaction_backward": (ops.interaction_backward, (torch.randn(2, 7, generator=g),
                                                            [torch.randn(2, 4, generator=g) for _ in range(3)])),
        "merged_embedding_bag": (ops.merged_embedding_bag, (w, idx, off, psw, "sum", False, False)),
        "merged_embedding_bag_dense_backward": (ops.merged_embedding_bag_dense_backward,
                                                (grads, w, idx, off, psw, "sum", False)),
        "roi_align": (ops.roi_align, (x, rois, 1.0, 2, 2, 2, False)),
        "roi_align_backward": (ops.roi_align_backward,
                               (torch.randn(2, 3, 2, 2, generator=g), rois, 1.0, 2, 2, 2, False, 2, 3, 5, 5, False)),
    }  # fmt: skip


_NAMES = sorted(_calls())


def _tensors(args: tuple) -> list[torch.Tensor]:
    found = []
    for a in args:
        found += [t for t in (a if isinstance(a, list) else [a]) if isinstance(t, torch.Tensor)]
    return found


def _moved(args: tuple, chosen: set[int]) -> tuple:
    """``args`` with the tensors numbered in ``chosen`` (in _tensors' order) on the meta device."""
    counter = iter(range(10**6))
    out = []
    for a in args:
        if isinstance(a, list):
            out.append([t.to("meta") if isinstance(t, torch.Tensor) and next(counter) in chosen else t for t in a])
        elif isinstance(a, torch.Tensor):
            out.append(a.to("meta") if next(counter) in chosen else a)
        else:
            out.append(a)
    return tuple(out)


# torch < 2.4 (ember registers Meta and Autograd kernels there) has no AutogradMeta kernel for an operator without a
# gradient formula: an all-meta call of one raises torch's NotImplementedError before reaching the Meta kernel.
_LEGACY = not ember._library._MODERN
_NO_GRADIENT = {"frozen_batch_norm_backward", "interaction_backward", "merged_embedding_bag_dense_backward",
                "roi_align_backward"}  # fmt: skip


@pytest.mark.parametrize("name", _NAMES)
def test_all_meta_gives_the_cpu_calls_shapes_and_dtypes(name):
    if _LEGACY and name in _NO_GRADIENT:
        pytest.skip("torch < 2.4 has no AutogradMeta kernel for an operator without a gradient formula")
    op, args = _calls()[name]
    cpu = op(*args)
    meta = op(*_moved(args, set(range(len(_tensors(args))))))
    cpu_out, meta_out = (
        _tensors((cpu,) if isinstance(cpu, torch.Tensor) else tuple(cpu)),
        _tensors((meta,) if isinstance(meta, torch.Tensor) else tuple(meta)),
    )
    assert len(cpu_out) == len(meta_out)
    for c, m in zip(cpu_out, meta_out):
        assert m.device.type == "meta" and m.shape == c.shape and m.dtype == c.dtype


@pytest.mark.parametrize("name", _NAMES)
@given(data=st.data())
def test_a_mix_of_meta_and_cpu_raises_before_anything_is_written(name, data):
    op, args = _calls()[name]
    count = len(_tensors(args))
    chosen = data.draw(st.sets(st.integers(0, count - 1), min_size=1, max_size=count - 1), label="on meta")
    mixed = _moved(args, chosen)
    names = ["same device"] + (["AutogradMeta"] if _LEGACY and name in _NO_GRADIENT else [])
    ok, _ = call_or_refuse(lambda: op(*mixed), _tensors(mixed), names)
    assert not ok, f"{name} took tensors on two devices"
