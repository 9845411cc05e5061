"""Properties of ember.nn's modules as modules: the fused embedding-bag updates apply torch.optim's step to the rows
a batch touched, or refuse a bad batch with the tables and their optimizer state byte for byte as they were;
MergedEmbeddingBag is its tables' nn.EmbeddingBag lookups; FrozenBatchNorm2d is torchvision's formula on any input
layout; MultiheadAttention is torch's in eval mode, and in training drops each attention probability or scales it by
1/(1-p) with the output computed from what it kept; RoIAlign and Dropout behave as their functional forms (fuzzed in
test_properties_functional)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fuzz import FLOATS, assert_close_or_both_nan, call_or_refuse, snapshot, tensors
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


@given(
    rows=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    dims=st.data(),
    bags=st.lists(st.lists(st.integers(0, 4), max_size=3), min_size=1, max_size=4),
    mode=st.sampled_from(["sum", "mean", "max"]),
    include_last_offset=st.booleans(),
)
def test_a_merged_embedding_bag_is_its_tables_lookups(rows, dims, bags, mode, include_last_offset):
    widths = dims.draw(st.lists(st.integers(1, 6), min_size=len(rows), max_size=len(rows)), label="widths")
    torch.manual_seed(0)
    if mode == "max":  # a clear refusal, not a wrong pooling
        with pytest.raises(NotImplementedError, match="mode 'max'"):
            ember.nn.MergedEmbeddingBag(rows, widths, mode=mode)
        return
    module = ember.nn.MergedEmbeddingBag(rows, widths, mode=mode, include_last_offset=include_last_offset)
    # one bag list for every table, indices folded into each table's rows
    indices = [torch.tensor([i % r for bag in bags for i in bag], dtype=torch.int64) for r in rows]
    starts = torch.tensor([0, *torch.tensor([len(b) for b in bags]).cumsum(0).tolist()[:-1]], dtype=torch.int64)
    offsets = torch.cat([starts, torch.tensor([indices[0].numel()])]) if include_last_offset else starts
    with torch.no_grad():
        got = module(indices, [offsets] * len(rows))
        for table, idx, out in zip(module, indices, got):
            torch.testing.assert_close(out, table(idx, offsets), atol=1e-6, rtol=1e-6)


@given(
    x=tensors(st.lists(st.integers(0, 4), min_size=4, max_size=4).map(lambda s: [s[0], 3, s[2], s[3]]), FLOATS),
    eps=st.sampled_from([1e-5, 0.0, 0.5]),
)
def test_the_frozen_batch_norm_module_is_torchvisions_formula(x, eps):
    torch.manual_seed(0)
    module = ember.nn.FrozenBatchNorm2d(3, eps=eps)
    module.weight.copy_(torch.randn(3))
    module.bias.copy_(torch.randn(3))
    module.running_mean.copy_(torch.randn(3))
    module.running_var.copy_(torch.rand(3) + 0.5)
    names = ["frozen_batch_norm", "FrozenBatchNorm2d", "x", "input", "dtype", "size", "shape", "dimension"]
    ok, got = call_or_refuse(lambda: module(x), [x, *module.buffers()], names)
    if not ok:
        return
    scale = module.weight.double() * (module.running_var.double() + eps).rsqrt()
    shift = module.bias.double() - module.running_mean.double() * scale
    expected = (x.double() * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1)).to(got.dtype)
    tol = 5e-2 if x.dtype in (torch.bfloat16, torch.float16) else 1e-5
    assert_close_or_both_nan(got, expected, atol=tol, rtol=tol)


@given(
    heads=st.sampled_from([1, 2, 4]),
    head_dim=st.integers(1, 4),
    target=st.integers(1, 5),
    source=st.integers(1, 5),
    batch=st.integers(1, 3),
    p=st.sampled_from([0.0, 0.1, 0.5, 0.9]),
    batch_first=st.booleans(),
    kdim_differs=st.booleans(),
    padded=st.booleans(),
)
def test_multihead_attention_is_torchs_or_drops_probabilities(
    heads, head_dim, target, source, batch, p, batch_first, kdim_differs, padded
):
    torch.manual_seed(0)
    embed = heads * head_dim
    kdim = embed + 1 if kdim_differs else embed
    module = ember.nn.MultiheadAttention(embed, heads, dropout=p, batch_first=batch_first, kdim=kdim, vdim=kdim)
    stock = torch.nn.MultiheadAttention(embed, heads, dropout=p, batch_first=batch_first, kdim=kdim, vdim=kdim)
    stock.load_state_dict(module.state_dict())
    shape = (
        (lambda length, width: (batch, length, width))
        if batch_first
        else (lambda length, width: (length, batch, width))
    )
    query, key = torch.randn(shape(target, embed)), torch.randn(shape(source, kdim))
    value = torch.randn(shape(source, kdim))
    padding = None
    if padded:  # a random key padding mask that leaves every bag at least one key
        padding = torch.rand(batch, source) < 0.4
        padding[:, 0] = False
    args = (query, key, value)
    kwargs = {"key_padding_mask": padding, "need_weights": True, "average_attn_weights": False}
    with torch.no_grad():
        eval_out, eval_weights = module.eval()(*args, **kwargs)
        stock_out, stock_weights = stock.eval()(*args, **kwargs)
        torch.testing.assert_close(eval_out, stock_out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(eval_weights, stock_weights, atol=1e-6, rtol=1e-6)
        out, weights = module.train()(*args, **kwargs)
    # Each probability dropped or scaled by 1/(1-p); the output is the attention of what was kept.
    kept = weights != 0
    torch.testing.assert_close(weights[kept], eval_weights[kept] / (1 - p), atol=1e-5, rtol=1e-5)
    v_weight = module.v_proj_weight if kdim_differs else module.in_proj_weight.chunk(3)[2]
    v = torch.nn.functional.linear(value, v_weight, module.in_proj_bias.chunk(3)[2])
    if not batch_first:
        v = v.transpose(0, 1)  # (batch, source, embed)
    v = v.reshape(batch, source, heads, head_dim).transpose(1, 2)  # (batch, heads, source, head_dim)
    attended = (weights @ v).transpose(1, 2).reshape(batch, target, embed)
    expected = torch.nn.functional.linear(attended, module.out_proj.weight, module.out_proj.bias)
    if not batch_first:
        expected = expected.transpose(0, 1)
    torch.testing.assert_close(out.detach(), expected.detach(), atol=1e-5, rtol=1e-5)
