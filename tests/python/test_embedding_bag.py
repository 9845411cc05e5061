"""ember.nn.MergedEmbeddingBag / merged_embedding_bag against a loop of torch.nn.EmbeddingBag (forward, dense and
sparse weight gradients, per-sample-weight gradients) on every ISA path, gradcheck, state_dict keys, the operator as
torch.fx and torch.compile see it, pooling into given tensors (out=), and bad input."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ember
from ember.nn import MergedEmbeddingBag, merged_embedding_bag

HAS_COMPILE = hasattr(torch, "compile") and hasattr(torch.library, "register_fake")


def random_lookup(rows: list[int], bags: int, max_len: int, gen: torch.Generator, *, dtype=torch.int64,
                  include_last: bool = False) -> tuple[list[torch.Tensor], list[torch.Tensor]]:  # fmt: skip
    """Per table, indices and offsets of `bags` bags of 0..max_len indices (empty bags included)."""
    indices, offsets = [], []
    for n in rows:
        lengths = torch.randint(0, max_len + 1, (bags,), generator=gen) if n else torch.zeros(bags, dtype=torch.int64)
        starts = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        total = int(starts[-1])
        # A few hot rows, so duplicates within and across bags are common.
        idx = torch.randint(0, max(n, 1), (total,), generator=gen)
        hot = torch.rand(total, generator=gen) < 0.3
        idx[hot] = idx[hot] % max(min(n, 3), 1)
        indices.append(idx.to(dtype))
        offsets.append((starts if include_last else starts[:-1]).to(dtype))
    return indices, offsets


def tables(rows: list[int], dims: list[int], dtype: torch.dtype, gen: torch.Generator, **kwargs) -> nn.ModuleList:
    out = nn.ModuleList([nn.EmbeddingBag(n, d, **kwargs) for n, d in zip(rows, dims)])
    with torch.no_grad():
        for t in out:
            t.weight.copy_(torch.randn(t.weight.shape, generator=gen))
    return out.to(dtype)


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    # The kernel sums in float32 and rounds once: against a float32 reference on the same bf16 values, within one
    # bf16 rounding (2^-8 relative). torch's own bf16 backward accumulates in bf16 and strays further on rows many
    # positions share, so bf16 results are checked against float32 torch, not bf16 torch.
    return {"atol": 1e-2, "rtol": 2**-8} if dtype == torch.bfloat16 else {"atol": 2e-5, "rtol": 1e-5}


ROWS, DIMS = [13, 200, 1, 64, 0], [16, 7, 33, 128, 4]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("include_last", [False, True])
def test_forward_and_gradients_match_a_loop_of_embedding_bags(isa_level, dtype, mode, weighted, include_last, gen):
    if weighted and mode == "mean":
        pytest.skip("torch allows per_sample_weights with mode 'sum' only")
    ours = MergedEmbeddingBag.from_embeddingbag_list(
        tables(ROWS, DIMS, dtype, gen, mode=mode, include_last_offset=include_last)
    )
    ref = tables(ROWS, DIMS, torch.float32, gen, mode=mode, include_last_offset=include_last)
    ref.load_state_dict(ours.state_dict())  # the same values, held in float32
    indices, offsets = random_lookup(ROWS, 9, 6, gen, dtype=torch.int32 if dtype == torch.float32 else torch.int64,
                                     include_last=include_last)  # fmt: skip
    psw = [torch.randn(i.shape, generator=gen).to(dtype) for i in indices] if weighted else [None] * len(ROWS)
    psw_ours = [p.clone().requires_grad_() if weighted else None for p in psw]
    psw_ref = [p.float().requires_grad_() if weighted else None for p in psw]

    expect = [t(i, o, per_sample_weights=p) for t, i, o, p in zip(ref, indices, offsets, psw_ref)]
    got = ours(indices, offsets, psw_ours if weighted else None)
    for e, g in zip(expect, got):
        assert g.dtype == dtype and g.shape == e.shape
        torch.testing.assert_close(g.float(), e, **tolerance(dtype))

    grads = [torch.randn(e.shape, generator=gen).to(dtype) for e in expect]
    torch.autograd.backward(expect, [g.float() for g in grads])
    torch.autograd.backward(got, grads)
    for t_ref, t_ours in zip(ref, ours):
        assert t_ours.weight.grad.dtype == dtype
        torch.testing.assert_close(t_ours.weight.grad.float(), t_ref.weight.grad, **tolerance(dtype))
    if weighted:
        for p_ref, p_ours in zip(psw_ref, psw_ours):
            assert p_ours.grad.dtype == dtype
            torch.testing.assert_close(p_ours.grad.float(), p_ref.grad, **tolerance(dtype))


def test_sparse_gradients_are_coalesced_coo_like_torchs(gen):
    ref = tables(ROWS, DIMS, torch.float32, gen, sparse=True)
    ours = MergedEmbeddingBag.from_embeddingbag_list(tables(ROWS, DIMS, torch.float32, gen, sparse=True))
    ours.load_state_dict(ref.state_dict())
    indices, offsets = random_lookup(ROWS, 7, 5, gen)
    sum(o.square().sum() for o in ours(indices, offsets)).backward()
    sum(t(i, o).square().sum() for t, i, o in zip(ref, indices, offsets)).backward()
    for t_ref, t_ours in zip(ref, ours):
        assert t_ours.weight.grad.is_sparse
        torch.testing.assert_close(t_ours.weight.grad.to_dense(), t_ref.weight.grad.to_dense(), atol=1e-5, rtol=1e-5)
    # The operator's gradient is coalesced (unique, ascending rows); .grad's accumulation may drop the mark.
    (grad,) = torch.autograd.grad(ours(indices, offsets)[1].sum(), ours[1].weight)
    assert grad.is_coalesced() and torch.equal(grad._indices(), grad._indices().unique().unsqueeze(0))
    # torch's sparse optimizers take it as they take nn.EmbeddingBag's.
    torch.optim.SGD(ours.parameters(), lr=0.1).step()


def test_lengths_and_fixed_length_bags_are_offsets_in_other_words(gen):
    merged = MergedEmbeddingBag([30, 40], [8, 8])
    indices, offsets = random_lookup([30, 40], 5, 4, gen)
    by_offsets = merged(indices, offsets)
    lengths = [torch.diff(torch.cat([o, torch.tensor([i.numel()])])) for i, o in zip(indices, offsets)]
    for a, b in zip(by_offsets, merged(indices, lengths=lengths)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    fixed = [torch.randint(0, 30, (5, 3), generator=gen), torch.randint(0, 40, (5, 3), generator=gen)]
    for a, t, i in zip(merged(fixed), merged, fixed):
        torch.testing.assert_close(a, t(i), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_gradcheck_float64(mode, gen):
    # float64 tables run the kernels' double path, so gradcheck holds them to its float64 defaults: the row
    # gradients (duplicates within and across bags, an empty bag, int32 indices) and, in sum mode, the per-sample
    # weights' gradients.
    weights = [
        torch.randn(6, 5, generator=gen, dtype=torch.float64, requires_grad=True),
        torch.randn(4, 3, generator=gen, dtype=torch.float64, requires_grad=True),
    ]
    indices = [torch.tensor([0, 5, 5, 2, 1]), torch.tensor([3, 3, 0], dtype=torch.int32)]
    offsets = [torch.tensor([0, 2, 2]), torch.tensor([0, 1], dtype=torch.int32)]
    psw = torch.randn(5, generator=gen, dtype=torch.float64, requires_grad=mode == "sum")

    def f(w0, w1, p0):
        return tuple(merged_embedding_bag([w0, w1], indices, offsets, [p0 if mode == "sum" else None, None], mode=mode))

    assert torch.autograd.gradcheck(f, (*weights, psw))


def test_float64_matches_the_embedding_bag_loop_to_double_rounding(gen):
    lst = tables([50, 7], [16, 9], torch.float64, gen, mode="sum")
    merged = MergedEmbeddingBag.from_embeddingbag_list(lst)
    inputs = [torch.randint(0, t.num_embeddings, (40,), generator=gen) for t in lst]
    offsets = [torch.tensor([0, 3, 3, 17, 30]) for _ in lst]
    psw = [torch.randn(40, generator=gen, dtype=torch.float64) for _ in lst]
    got = merged(inputs, offsets, psw)
    for g, t, i, o, p in zip(got, lst, inputs, offsets, psw):
        assert g.dtype == torch.float64
        torch.testing.assert_close(g, t(i, o, per_sample_weights=p), atol=1e-12, rtol=1e-12)


def test_state_dict_is_the_module_lists(gen):
    lst = tables([10, 20], [4, 6], torch.float32, gen)
    merged = MergedEmbeddingBag.from_embeddingbag_list(lst)
    assert list(merged.state_dict()) == ["0.weight", "1.weight"] == list(lst.state_dict())
    assert merged[1] is lst[1] and merged[0].weight is lst[0].weight  # shared, not copied
    plain = nn.ModuleList([nn.EmbeddingBag(10, 4), nn.EmbeddingBag(20, 6)])
    plain.load_state_dict(merged.state_dict())
    merged.load_state_dict(plain.state_dict())
    model = nn.Module()
    model.emb_l = merged
    assert list(model.state_dict()) == ["emb_l.0.weight", "emb_l.1.weight"]


def test_one_operator_under_fx():
    merged = MergedEmbeddingBag([10, 20], 8)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = merged

        def forward(self, i0, i1, o0, o1):
            return self.emb([i0, i1], [o0, o1])

    traced = torch.fx.symbolic_trace(Model())
    calls = [n.target for n in traced.graph.nodes if n.op == "call_function"]
    assert calls == [torch.ops.ember.merged_embedding_bag]
    args = (torch.tensor([1, 9]), torch.tensor([0, 19, 3]), torch.tensor([0, 1]), torch.tensor([0]))
    for a, b in zip(traced(*args), Model()(*args)):
        torch.testing.assert_close(a, b)


@pytest.mark.skipif(not HAS_COMPILE, reason="torch.compile with fake kernels needs torch >= 2.4")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # inductor's own imports
def test_torch_compile_traces_forward_and_backward_without_a_break(gen):
    merged = MergedEmbeddingBag([10, 20], 8)
    indices, offsets = random_lookup([10, 20], 4, 3, gen)
    compiled = torch.compile(lambda i, o: sum(x.sum() for x in merged(i, o)), fullgraph=True)
    compiled(indices, offsets).backward()
    expect = [w.grad.clone() for w in merged.parameters()]
    merged.zero_grad()
    sum(x.sum() for x in merged(indices, offsets)).backward()
    for e, w in zip(expect, merged.parameters()):
        torch.testing.assert_close(w.grad, e)


def test_without_grad_the_kernel_runs_directly_unless_something_watches_dispatch(gen, monkeypatch):
    """With no gradient wanted, eager and unobserved, the functional form skips torch's dispatcher (the kernel
    function directly); with a gradient wanted, under a dispatch mode and under the profiler the operator runs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from ember.nn import embedding_bag_ops as ops

    dispatched = []

    def counting_forward(*args):
        dispatched.append(1)
        return operator(*args)

    operator = ops._forward
    monkeypatch.setattr(ops, "_forward", counting_forward)
    merged = MergedEmbeddingBag.from_embeddingbag_list(tables([10, 20], [8, 3], torch.float32, gen))
    indices, offsets = random_lookup([10, 20], 4, 3, gen)
    expect = [t(i, o) for t, i, o in zip(merged, indices, offsets)]
    with torch.no_grad():
        direct = merged(indices, offsets)
    assert dispatched == []
    with_grad = merged(indices, offsets)
    assert len(dispatched) == 1 and all(x.requires_grad for x in with_grad)

    seen = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with torch.no_grad():
        with Watch():
            watched = merged(indices, offsets)
        with torch.profiler.profile() as prof:
            profiled = merged(indices, offsets)
    assert torch.ops.ember.merged_embedding_bag.default in seen
    assert any("ember::merged_embedding_bag" in e.name for e in prof.events())
    assert len(dispatched) == 3
    for outs in (direct, with_grad, watched, profiled):
        for got, want in zip(outs, expect):
            torch.testing.assert_close(got, want, **tolerance(torch.float32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("weighted", [False, True])
def test_out_receives_the_pooled_bags(isa_level, dtype, weighted, gen):
    """out= writes what the call would return, bit for bit, into the given tensors, and returns them; the fused
    modules take it at inference."""
    merged = MergedEmbeddingBag.from_embeddingbag_list(tables(ROWS, DIMS, dtype, gen, mode="sum"))
    indices, offsets = random_lookup(ROWS, 9, 4, gen)
    psw = [torch.rand(i.shape, generator=gen, dtype=dtype) for i in indices] if weighted else None
    out = [torch.full((9, d), float("nan"), dtype=dtype) for d in DIMS]
    with torch.no_grad():
        expect = merged(indices, offsets, psw)
        got = merged(indices, offsets, psw, out=out)
    assert all(g is o for g, o in zip(got, out))
    for o, e in zip(out, expect):
        assert torch.equal(o, e)
    fused = ember.nn.MergedEmbeddingBagWithSGD.from_embeddingbag_list(list(merged), lr=0.1)
    again = [torch.empty_like(o) for o in out]
    if dtype != torch.float64:
        with torch.no_grad():
            fused(indices, offsets, psw, out=again)
        assert all(torch.equal(a, e) for a, e in zip(again, expect))


def test_out_goes_through_its_operator_when_something_watches(gen, monkeypatch):
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    merged = MergedEmbeddingBag.from_embeddingbag_list(tables([10, 20], [8, 3], torch.float32, gen))
    indices, offsets = random_lookup([10, 20], 4, 3, gen)
    out = [torch.empty(4, 8), torch.empty(4, 3)]
    with torch.no_grad():
        expect = merged(indices, offsets)
        merged(indices, offsets, out=out)
        assert seen == []
        with Watch():
            watched = merged(indices, offsets, out=[torch.empty(4, 8), torch.empty(4, 3)])
    assert torch.ops.ember.merged_embedding_bag_out.default in seen
    for o, w, e in zip(out, watched, expect):
        assert torch.equal(o, e) and torch.equal(w, e)


def test_out_is_one_operator_under_fx():
    merged = MergedEmbeddingBag([10, 20], 8)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = merged

        def forward(self, i0, i1, o0, o1, r0, r1):
            return self.emb([i0, i1], [o0, o1], out=[r0, r1])

    traced = torch.fx.symbolic_trace(Model())
    calls = [n.target for n in traced.graph.nodes if n.op == "call_function"]
    assert calls == [torch.ops.ember.merged_embedding_bag_out]
    args = (torch.tensor([1, 9]), torch.tensor([0, 19, 3]), torch.tensor([0, 1]), torch.tensor([0]))
    out = [torch.empty(2, 8), torch.empty(1, 8)]
    with torch.no_grad():
        traced(*args, *out)
        for a, b in zip(out, Model()(*args, torch.empty(2, 8), torch.empty(1, 8))):
            assert torch.equal(a, b)


@pytest.mark.skipif(not HAS_COMPILE, reason="torch.compile with fake kernels needs torch >= 2.4")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # inductor's own imports
def test_out_under_torch_compile(gen):
    merged = MergedEmbeddingBag([10, 20], 8)
    indices, offsets = random_lookup([10, 20], 4, 3, gen)
    compiled = torch.compile(lambda i, o, out: merged(i, o, out=out), fullgraph=True)
    out = [torch.empty(4, 8), torch.empty(4, 8)]
    with torch.no_grad():
        compiled(indices, offsets, out)
        expect = merged(indices, offsets)
    for o, e in zip(out, expect):
        assert torch.equal(o, e)


def test_bad_out_raises_and_writes_nothing():
    merged = MergedEmbeddingBag([10, 20], 8)
    good_i, good_o = [torch.tensor([1, 2]), torch.tensor([3])], [torch.tensor([0, 1]), torch.tensor([0])]
    out = [torch.full((2, 8), 7.0), torch.full((1, 8), 7.0)]
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"out\[1\] must be contiguous"):
            merged(good_i, good_o, out=[out[0], torch.empty(1, 16)[:, ::2]])
        with pytest.raises(ValueError, match=r"out\[1\] must be \[1, 8\]"):
            merged(good_i, good_o, out=[out[0], torch.empty(2, 8)])
        with pytest.raises(TypeError, match=r"out\[1\] must have dtype float32"):
            merged(good_i, good_o, out=[out[0], torch.empty(1, 8, dtype=torch.float64)])
        with pytest.raises(ValueError, match="out must have one entry per table"):
            merged(good_i, good_o, out=out[:1])
        with pytest.raises(TypeError, match=r"out\[1\] must be a torch.Tensor"):
            merged(good_i, good_o, out=[out[0], None])
        with pytest.raises(ValueError, match=r"out\[1\] and weights\[1\] share memory"):
            merged(good_i, good_o, out=[out[0], merged[1].weight[:1]])
        with pytest.raises(ValueError, match=r"out\[0\] and out\[1\] share memory"):
            merged(good_i, good_o, out=[out[0], out[0][:1]])
        with pytest.raises(IndexError, match="out of range"):
            merged([good_i[0], torch.tensor([20])], good_o, out=out)
    with pytest.raises(RuntimeError, match="out= does not support automatic differentiation"):
        merged(good_i, good_o, out=out)
    assert all(bool((o == 7.0).all()) for o in out)


@pytest.mark.skipif(not hasattr(torch.library, "opcheck"), reason="torch.library.opcheck needs torch >= 2.4")
def test_opcheck():
    weights = [torch.randn(10, 8, requires_grad=True), torch.randn(5, 8, requires_grad=True)]
    args = (weights, [torch.tensor([1, 2, 9]), torch.tensor([0, 4])], [torch.tensor([0, 1]), torch.tensor([0])],
            [torch.randn(3, requires_grad=True), torch.empty(0, 0)], "sum", False, False)  # fmt: skip
    torch.library.opcheck(torch.ops.ember.merged_embedding_bag.default, args)
    with torch.no_grad():
        out = [torch.empty(2, 8), torch.empty(1, 8)]
        torch.library.opcheck(torch.ops.ember.merged_embedding_bag_out.default, (*args[:-1], out))


def test_bad_input_raises_a_clear_error():
    merged = MergedEmbeddingBag([10, 20], 8)
    good_i, good_o = [torch.tensor([1, 2]), torch.tensor([3])], [torch.tensor([0, 1]), torch.tensor([0])]
    with pytest.raises(IndexError, match=r"indices\[1\]\[0\] is 20, out of range for table 1 of 20 rows"):
        merged([*good_i[:1], torch.tensor([20])], good_o)
    with pytest.raises(IndexError, match="out of range"):
        merged([torch.tensor([-1, 2]), good_i[1]], good_o)
    with pytest.raises(ValueError, match=r"offsets\[0\] must not decrease"):
        merged([torch.tensor([1, 2, 3]), good_i[1]], [torch.tensor([0, 2, 1]), good_o[1]])
    with pytest.raises(ValueError, match=r"offsets\[0\] must start at 0"):
        merged(good_i, [torch.tensor([1, 1]), good_o[1]])
    with pytest.raises(ValueError, match=r"must not pass the end"):
        merged(good_i, [torch.tensor([0, 5]), good_o[1]])
    with pytest.raises(ValueError, match="one entry per table"):
        merged(good_i[:1], good_o[:1])
    with pytest.raises(TypeError, match="must be a list"):
        merged(torch.tensor([1, 2]), good_o)
    with pytest.raises(TypeError, match="int64 or int32"):
        merged([torch.tensor([1.0, 2.0]), good_i[1]], good_o)
    with pytest.raises(ValueError, match="mode 'sum'"):
        MergedEmbeddingBag([10], 8, mode="mean")([good_i[0]], [good_o[0]], [torch.ones(2)])
    with pytest.raises(ValueError, match="mode must be"):
        merged_embedding_bag(list(merged.parameters()), good_i, good_o, mode="max")
    with pytest.raises(NotImplementedError, match="padding_idx"):
        MergedEmbeddingBag.from_embeddingbag_list([nn.EmbeddingBag(5, 2, padding_idx=0)])
    with pytest.raises(ValueError, match="same mode"):
        MergedEmbeddingBag.from_embeddingbag_list([nn.EmbeddingBag(5, 2), nn.EmbeddingBag(5, 2, mode="sum")])
    with pytest.raises(NotImplementedError, match="mode 'max'"):
        MergedEmbeddingBag.from_embeddingbag_list([nn.EmbeddingBag(5, 2, mode="max")])


def test_the_kernel_runs_at_the_expected_level(isa_level):
    level = ember._C.embedding_bag_implementation()
    assert level == ("ref" if isa_level == "ref" else "avx2" if isa_level == "avx2" else "avx512")
