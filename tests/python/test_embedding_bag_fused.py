"""MergedEmbeddingBagWithSGD / WithAdagrad: training steps against nn.EmbeddingBag(sparse=True) with torch's SGD and
Adagrad, weight decay and bf16 storages against a float64 reference, split-BF16 checkpoints, torch.optim-format
state round trips, thread-count independence, and bad input that writes nothing."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ember
from ember.nn import MergedEmbeddingBagWithAdagrad, MergedEmbeddingBagWithSGD, dense_parameters

ROWS, DIM = [12, 300, 1, 40], 24

pytestmark = pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled")


def batch(gen: torch.Generator, bags: int = 6) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    indices, offsets = [], []
    for n in ROWS:
        lengths = torch.randint(0, 6, (bags,), generator=gen)
        idx = torch.randint(0, n, (int(lengths.sum()),), generator=gen)
        idx[::3] = idx[::3] % min(n, 2)  # duplicates within and across bags
        indices.append(idx)
        offsets.append(torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)[:-1]]))
    return indices, offsets


def loss_of(outputs: list[torch.Tensor], targets: list[torch.Tensor]) -> torch.Tensor:
    return sum((o.float() * t).sum() + 0.5 * o.float().square().sum() for o, t in zip(outputs, targets))


def reference_tables(gen: torch.Generator) -> nn.ModuleList:
    tables = nn.ModuleList([nn.EmbeddingBag(n, DIM, mode="sum", sparse=True) for n in ROWS])
    with torch.no_grad():
        for t in tables:
            t.weight.copy_(0.1 * torch.randn(t.weight.shape, generator=gen))
    return tables


CASES = [
    (MergedEmbeddingBagWithSGD, torch.optim.SGD, {"lr": 0.05}),
    (
        MergedEmbeddingBagWithAdagrad,
        torch.optim.Adagrad,
        {"lr": 0.05, "lr_decay": 0.01, "eps": 1e-8, "initial_accumulator_value": 0.1},
    ),
]


@pytest.mark.parametrize(("cls", "torch_optimizer", "hyper"), CASES)
def test_training_follows_torchs_sparse_optimizer(isa_level, cls, torch_optimizer, hyper, gen):
    ref = reference_tables(gen)
    fused = cls.from_embeddingbag_list([nn.EmbeddingBag(n, DIM, mode="sum") for n in ROWS], **hyper)
    fused.load_state_dict(ref.state_dict())
    optimizer = torch_optimizer(ref.parameters(), **hyper)
    for _ in range(4):
        indices, offsets = batch(gen)
        targets = [torch.randn(6, DIM, generator=gen) for _ in ROWS]
        optimizer.zero_grad()
        loss_of([t(i, o) for t, i, o in zip(ref, indices, offsets)], targets).backward()
        optimizer.step()
        loss_of(fused(indices, offsets), targets).backward()
    for t_ref, t_fused in zip(ref, fused):
        assert t_fused.weight.grad is None  # no gradient tensor, ever
        torch.testing.assert_close(t_fused.weight, t_ref.weight, atol=1e-6, rtol=1e-5)
    if cls is MergedEmbeddingBagWithAdagrad:
        for t_ref, state_sum, step in zip(ref, fused.state_sums, fused.steps):
            torch.testing.assert_close(state_sum, optimizer.state[t_ref.weight]["sum"], atol=1e-6, rtol=1e-5)
            assert float(step) == float(optimizer.state[t_ref.weight]["step"]) == 4


def reference_step(weights: list[torch.Tensor], sums: list[torch.Tensor] | None, indices, offsets, grads, hyper,
                   step: int) -> None:  # fmt: skip
    """The documented update in float64, on the touched rows (ember/embedding_bag.h)."""
    for t, (w, i, o, g) in enumerate(zip(weights, indices, offsets, grads)):
        ends = torch.cat([o[1:], torch.tensor([i.numel()])])
        dw: dict[int, torch.Tensor] = {}
        for b in range(o.numel()):
            for p in range(int(o[b]), int(ends[b])):
                r = int(i[p])
                dw[r] = dw.get(r, torch.zeros(w.shape[1], dtype=torch.float64)) + g[b].double()
        for r, grad in dw.items():
            grad = grad + hyper.get("weight_decay", 0.0) * w[r]
            if sums is None:
                w[r] -= hyper["lr"] * grad
            else:
                sums[t][r] += grad * grad
                clr = hyper["lr"] / (1 + (step - 1) * hyper.get("lr_decay", 0.0))
                w[r] -= clr * grad / (sums[t][r].sqrt() + hyper.get("eps", 1e-10))


@pytest.mark.parametrize("adagrad", [False, True])
@pytest.mark.parametrize("storage", ["float32", "bfloat16", "split"])
def test_weight_decay_and_storages_against_a_float64_reference(isa_level, adagrad, storage, gen):
    hyper = {"lr": 0.05, "weight_decay": 0.01} | ({"lr_decay": 0.01, "eps": 1e-6} if adagrad else {})
    cls = MergedEmbeddingBagWithAdagrad if adagrad else MergedEmbeddingBagWithSGD
    fused = cls(ROWS, DIM, dtype=torch.bfloat16 if storage == "bfloat16" else None, **hyper)
    with torch.no_grad():
        for t in fused:
            t.weight.copy_(torch.randn(t.weight.shape, generator=gen))
    if storage == "split":
        fused.split_bf16_()
    weights = [w.double() for w in fused.state_dict().values()]  # float32 master values when split
    sums = [torch.zeros(w.shape, dtype=torch.float64) for w in weights] if adagrad else None
    for step in (1, 2):
        indices, offsets = batch(gen)
        grads = [torch.randn(6, DIM, generator=gen).to(fused[0].weight.dtype) for _ in ROWS]
        torch.autograd.backward(fused(indices, offsets), grads)
        reference_step(weights, sums, indices, offsets, grads, hyper, step)
    tol = {"atol": 1e-2, "rtol": 2**-8} if storage == "bfloat16" else {"atol": 1e-5, "rtol": 1e-5}
    for got, expect in zip(fused.state_dict().values(), weights):
        assert got.dtype == (torch.bfloat16 if storage == "bfloat16" else torch.float32)
        torch.testing.assert_close(got.double(), expect, **tol)
    if storage == "split":
        assert all(t.weight.dtype == torch.bfloat16 for t in fused)  # the model computes with the bf16 halves


def test_split_bf16_checkpoints_are_plain_float32(gen):
    fused = MergedEmbeddingBagWithAdagrad(ROWS, DIM, lr=0.1)
    exact = {k: v.clone() for k, v in fused.state_dict().items()}
    fused.split_bf16_()
    for key, value in fused.state_dict().items():
        assert value.dtype == torch.float32 and torch.equal(value, exact[key])  # bit for bit
    plain = nn.ModuleList([nn.EmbeddingBag(n, DIM) for n in ROWS])
    plain.load_state_dict(fused.state_dict())
    changed = {k: v + 1 for k, v in exact.items()}
    fused.load_state_dict(changed)
    for key, value in fused.state_dict().items():
        assert torch.equal(value, changed[key])


def test_optimizer_state_round_trips_through_torch_optim(gen):
    fused = MergedEmbeddingBagWithAdagrad(ROWS, DIM, lr=0.2, lr_decay=0.05, eps=1e-7)
    for _ in range(3):
        indices, offsets = batch(gen)
        sum(o.sum() for o in fused(indices, offsets)).backward()
    state = fused.optimizer_state_dict()
    plain = nn.ModuleList([nn.EmbeddingBag(n, DIM, sparse=True) for n in ROWS])
    torch_adagrad = torch.optim.Adagrad(plain.parameters(), lr=0.01)
    torch_adagrad.load_state_dict(state)
    assert torch_adagrad.param_groups[0]["lr"] == 0.2 and torch_adagrad.param_groups[0]["lr_decay"] == 0.05
    for t, state_sum in zip(plain, fused.state_sums):
        assert torch.equal(torch_adagrad.state[t.weight]["sum"], state_sum)
        assert float(torch_adagrad.state[t.weight]["step"]) == 3
    other = MergedEmbeddingBagWithAdagrad(ROWS, DIM)
    other.load_optimizer_state_dict(torch_adagrad.state_dict())
    assert (other.lr, other.lr_decay, other.eps) == (0.2, 0.05, 1e-7)
    for a, b in zip(other.state_sums + other.steps, fused.state_sums + fused.steps):
        assert torch.equal(a, b)
    sgd = MergedEmbeddingBagWithSGD(ROWS, DIM, lr=0.3, weight_decay=0.1)
    restored = MergedEmbeddingBagWithSGD(ROWS, DIM)
    restored.load_optimizer_state_dict(sgd.optimizer_state_dict())
    assert (restored.lr, restored.weight_decay) == (0.3, 0.1)
    with pytest.raises(NotImplementedError, match="momentum"):
        restored.load_optimizer_state_dict(torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9).state_dict())


def test_per_sample_weight_gradients_use_the_weights_before_the_step(gen):
    ref = reference_tables(gen)
    fused = MergedEmbeddingBagWithSGD.from_embeddingbag_list(
        [nn.EmbeddingBag(n, DIM, mode="sum") for n in ROWS], lr=1.0
    )
    fused.load_state_dict(ref.state_dict())
    indices, offsets = batch(gen)
    psw_ref = [torch.rand(i.shape, generator=gen, requires_grad=True) for i in indices]
    psw_fused = [p.detach().clone().requires_grad_() for p in psw_ref]
    sum(t(i, o, per_sample_weights=p).sum() for t, i, o, p in zip(ref, indices, offsets, psw_ref)).backward()
    sum(o.sum() for o in fused(indices, offsets, psw_fused)).backward()
    for a, b in zip(psw_fused, psw_ref):
        torch.testing.assert_close(a.grad, b.grad)


def test_results_do_not_depend_on_the_thread_count(gen):
    results = []
    for threads in (1, 2):
        torch.manual_seed(0)
        fused = MergedEmbeddingBagWithAdagrad(ROWS, DIM, lr=0.1)
        local = torch.Generator().manual_seed(5)
        saved = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            for _ in range(3):
                indices, offsets = batch(local, bags=64)
                sum(o.square().sum() for o in fused(indices, offsets)).backward()
        finally:
            torch.set_num_threads(saved)
        results.append([t.weight.detach().clone() for t in fused])
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_inference_and_no_grad_do_not_step(gen):
    fused = MergedEmbeddingBagWithSGD(ROWS, DIM, lr=1.0)
    before = [t.weight.detach().clone() for t in fused]
    indices, offsets = batch(gen)
    with torch.no_grad():
        fused(indices, offsets)
    for t, b in zip(fused, before):
        assert torch.equal(t.weight, b)


def test_dense_parameters_leave_the_fused_tables_out():
    model = nn.Module()
    model.top = nn.Linear(4, 4)
    model.emb = MergedEmbeddingBagWithSGD([5, 6], 4)
    assert [p.shape for p in dense_parameters(model)] == [p.shape for p in model.top.parameters()]


def test_bad_input_raises_and_writes_nothing(gen):
    fused = MergedEmbeddingBagWithAdagrad(ROWS, DIM, lr=0.1)
    before = [t.weight.detach().clone() for t in fused]
    sums = [s.clone() for s in fused.state_sums]
    indices, offsets = batch(gen)
    indices[3] = torch.cat([indices[3], torch.tensor([ROWS[3]])])
    with pytest.raises(IndexError, match=r"indices\[3\]"):
        fused(indices, offsets)
    # The update itself re-checks: an index out of range raises before any row is written.
    grads = [torch.ones(6, DIM) for _ in ROWS]
    weights = [t.weight for t in fused]
    with torch.no_grad(), pytest.raises(IndexError, match="out of range"):
        torch.ops.ember.merged_embedding_bag_adagrad_(weights, [torch.empty(0)] * 4, fused.state_sums, fused.steps,
                                                      grads, indices, offsets, [torch.empty(0, 0)] * 4, "sum", False,
                                                      0.1, 0.0, 0.0, 1e-10)  # fmt: skip
    for t, b, s, s0 in zip(fused, before, fused.state_sums, sums):
        assert torch.equal(t.weight, b) and torch.equal(s, s0)
    assert all(float(s) == 0 for s in fused.steps)
    # float64 tables look up (inference) but do not train fused; the kernel refuses the update too.
    double = MergedEmbeddingBagWithSGD(ROWS, DIM, lr=0.1).double()
    in_range = [*indices[:3], indices[3][:-1]]
    with torch.no_grad():
        assert double(in_range, offsets)[0].dtype == torch.float64
    with pytest.raises(TypeError, match="float64"):
        double(in_range, offsets)
    with torch.no_grad(), pytest.raises(TypeError, match="fused updates take float32 or bfloat16"):
        torch.ops.ember.merged_embedding_bag_sgd_([t.weight for t in double], [torch.empty(0)] * 4,
                                                  [g.double() for g in grads], in_range, offsets,
                                                  [torch.empty(0, 0)] * 4, "sum", False, 0.1, 0.0)  # fmt: skip
    with pytest.raises(ValueError, match="lr must be a finite number"):
        MergedEmbeddingBagWithSGD(ROWS, DIM, lr=-1.0)
    with pytest.raises(TypeError, match="unexpected arguments"):
        MergedEmbeddingBagWithSGD(ROWS, DIM, momentum=0.9)


def test_repr_names_the_hyper_parameters():
    assert "lr=0.5" in repr(ember.nn.MergedEmbeddingBagWithSGD([3], 2, lr=0.5))


def test_ember_optimize_bf16_splits_the_tables_and_leaves_them_out_of_the_optimizer(gen):
    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = MergedEmbeddingBagWithAdagrad(ROWS, DIM, lr=0.1)
            self.top = nn.Linear(DIM, 1)

        def forward(self, indices, offsets):
            return sum(self.top(x).sum() for x in self.emb(indices, offsets))

    model = Model()
    exact = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(dense_parameters(model), lr=0.1)
    model, optimizer = ember.optimize(model, optimizer=optimizer, dtype=torch.bfloat16)
    assert all(t.weight.dtype == torch.bfloat16 for t in model.emb)
    assert all(v.dtype == torch.float32 for v in model.state_dict().values())
    assert torch.equal(model.state_dict()["emb.0.weight"], exact["emb.0.weight"])  # split, not rounded
    indices, offsets = batch(gen)
    model(indices, offsets).backward()
    optimizer.step()
    assert float(model.emb.steps[0]) == 1
    assert not torch.equal(model.state_dict()["emb.1.weight"], exact["emb.1.weight"])
