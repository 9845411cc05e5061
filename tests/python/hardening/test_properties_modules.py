"""Properties of ember.nn's modules as modules: the fused embedding-bag updates apply torch.optim's step to the rows
a batch touched, or refuse a bad batch with the tables and their optimizer state byte for byte as they were;
RoIAlign, FrozenBatchNorm2d and Dropout behave as their functional forms (fuzzed in test_properties_functional)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fuzz import call_or_refuse, snapshot
from hypothesis import given
from hypothesis import strategies as st

import ember
from ember.nn import MergedEmbeddingBagWithAdagrad, MergedEmbeddingBagWithSGD

_NAMES = ["merged_embedding_bag", "indices", "offsets", "per_sample_weights", "lengths", "weights", "mode", "lr",
          "must", "MergedEmbeddingBag"]  # fmt: skip
_FUSED = {
    "SGD": (MergedEmbeddingBagWithSGD, torch.optim.SGD, {"lr": 0.1, "weight_decay": 0.01}),
    "Adagrad": (MergedEmbeddingBagWithAdagrad, torch.optim.Adagrad, {"lr": 0.1, "eps": 1e-10}),
}


def _state(module: torch.nn.Module) -> list[torch.Tensor]:
    return [t.weight for t in module] + list(getattr(module, "state_sums", [])) + list(getattr(module, "steps", []))


@pytest.mark.parametrize("name", sorted(_FUSED))
@given(
    rows=st.lists(st.integers(1, 6), min_size=1, max_size=3),
    dim=st.integers(1, 9),
    bags=st.lists(st.lists(st.integers(-3, 8), max_size=3), min_size=1, max_size=4),
    index_dtype=st.sampled_from([torch.int64, torch.int32, torch.float32]),
)
def test_a_fused_update_is_torch_optims_step_or_leaves_everything_untouched(name, rows, dim, bags, index_dtype):
    cls, torch_optimizer, hyper = _FUSED[name]
    torch.manual_seed(0)
    module = cls(rows, dim, **hyper)
    flat = [i for bag in bags for i in bag]
    indices = [torch.tensor(flat, dtype=torch.int64).to(index_dtype) for _ in rows]
    starts = torch.tensor([0, *torch.tensor([len(b) for b in bags]).cumsum(0).tolist()][:-1], dtype=torch.int64)
    offsets = [starts.to(index_dtype if index_dtype != torch.float32 else torch.int64) for _ in rows]
    tables = [torch.nn.EmbeddingBag(r, dim, mode="sum") for r in rows]
    for table, fused in zip(tables, module):
        table.weight.data.copy_(fused.weight.detach())
    reference = torch_optimizer([t.weight for t in tables], **hyper)

    before = snapshot(_state(module))
    ok, outputs = call_or_refuse(lambda: module(indices, offsets), _state(module), _NAMES)
    if not ok:
        assert snapshot(_state(module)) == before
        return
    assert index_dtype != torch.float32 or not flat, "float indices were taken"
    assert all(0 <= i < min(rows) for i in flat), "out-of-range indices were taken"
    sum(o.square().sum() for o in outputs).backward()
    expected = [F.embedding_bag(indices[t].long(), tables[t].weight, starts, mode="sum") for t in range(len(rows))]
    sum(e.square().sum() for e in expected).backward()
    untouched = [t.weight.detach().clone() for t in tables]
    reference.step()
    touched = sorted(set(flat))
    for table, fused, old in zip(tables, module, untouched):
        # the fused update touches the rows the batch looked up (weight decay too, as a sparse update would)
        want = old.clone()
        want[touched] = table.weight.detach()[touched]
        torch.testing.assert_close(fused.weight.detach(), want, atol=1e-5, rtol=1e-5)


@given(
    channels=st.integers(1, 4),
    output_size=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    sampling_ratio=st.sampled_from([-1, 0, 2]),
    aligned=st.booleans(),
)
def test_the_roi_align_module_is_its_function(channels, output_size, sampling_ratio, aligned):
    x = torch.randn(2, channels, 6, 7)
    boxes = torch.tensor([[0, 0.5, 1.0, 4.0, 5.0], [1, 2.0, 0.0, 6.5, 3.0]])
    module = ember.nn.RoIAlign(output_size, 0.9, sampling_ratio, aligned)
    expected = ember.nn.functional.roi_align(x, boxes, output_size, 0.9, sampling_ratio, aligned)
    torch.testing.assert_close(module(x, boxes), expected, atol=0, rtol=0)


@given(p=st.floats(0, 1, exclude_max=True), training=st.booleans(), inplace=st.booleans())
def test_the_dropout_module_keeps_or_scales_each_element(p, training, inplace):
    x = torch.randn(64)
    original = x.clone()
    module = ember.nn.Dropout(p, inplace=inplace).train(training)
    out = module(x)
    if not training:
        assert torch.equal(out, original)
        return
    kept = out != 0
    torch.testing.assert_close(out[kept], original[kept] / (1 - p), atol=1e-5, rtol=1e-5)
    if inplace:
        assert out.data_ptr() == x.data_ptr()
