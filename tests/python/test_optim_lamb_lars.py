"""ember.optim.Lamb and LARS against float64 references of their documented formulas."""

from __future__ import annotations

import copy

import pytest
import torch

from ember.optim import LARS, Lamb

SHAPES = [(1000,), (33, 7), (5,), (9000,), (0,), (4096 * 3 + 17,)]


def make(gen: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(s, generator=gen).requires_grad_() for s in SHAPES]


def lamb_reference(params, grads_per_step, lr, betas, eps, weight_decay, bias_correction=True):
    ps = [p.detach().double().clone() for p in params]
    ms = [torch.zeros_like(p) for p in ps]
    vs = [torch.zeros_like(p) for p in ps]
    b1, b2 = betas
    for t, grads in enumerate(grads_per_step, start=1):
        for p, g, m, v in zip(ps, grads, ms, vs):
            g = g.double()
            m.add_((1 - b1) * (g - m))
            v.mul_(b2).add_((1 - b2) * g * g)
            bc1, bc2 = (1 - b1**t, 1 - b2**t) if bias_correction else (1.0, 1.0)
            u = (m / bc1) / ((v / bc2).sqrt() + eps) + weight_decay * p
            pn, un = p.norm(), u.norm()
            trust = (pn / un) if pn > 0 and un > 0 else 1.0
            p.sub_(lr * trust * u)
    return ps


def lars_reference(params, grads_per_step, lr, momentum, weight_decay, trust_coefficient, eps, nesterov=False):
    ps = [p.detach().double().clone() for p in params]
    bufs = [None] * len(ps)
    for grads in grads_per_step:
        for i, (p, g) in enumerate(zip(ps, grads)):
            g = g.double()
            pn, gn = p.norm(), g.norm()
            trust = trust_coefficient * pn / (gn + weight_decay * pn + eps) if pn > 0 and gn > 0 else 1.0
            d = (g + weight_decay * p) * trust
            if momentum:
                bufs[i] = d.clone() if bufs[i] is None else bufs[i] * momentum + d
                d = d + momentum * bufs[i] if nesterov else bufs[i]
            p.sub_(lr * d)
    return ps


def run(opt_cls, kwargs, gen, steps=20):
    params = make(gen)
    start = [p.detach().clone() for p in params]
    grads_per_step = [[torch.randn(s, generator=gen) for s in SHAPES] for _ in range(steps)]
    opt = opt_cls(params, **kwargs)
    for grads in grads_per_step:
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
        for p, g in zip(params, grads):
            assert torch.equal(p.grad, g), "the gradient must not be overwritten"
    return start, grads_per_step, params, opt


@pytest.mark.parametrize(
    "kwargs",
    [{"lr": 1e-2}, {"lr": 5e-3, "weight_decay": 0.01, "betas": (0.8, 0.99)}, {"lr": 1e-2, "bias_correction": False}],
)
def test_lamb_matches_float64_reference(isa_level: str, kwargs, gen: torch.Generator) -> None:
    start, grads, params, _ = run(Lamb, kwargs, gen)
    full = {"betas": (0.9, 0.999), "eps": 1e-6, "weight_decay": 0.0, **kwargs}
    reference = lamb_reference(start, grads, **full)
    for p, r in zip(params, reference):
        if r.numel():
            assert (p.double() - r).norm() <= 1e-5 * r.norm()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lr": 0.1},
        {"lr": 0.1, "momentum": 0.0, "weight_decay": 1e-4},
        {"lr": 0.1, "nesterov": True, "weight_decay": 5e-4, "trust_coefficient": 0.02},
    ],
)
def test_lars_matches_float64_reference(isa_level: str, kwargs, gen: torch.Generator) -> None:
    start, grads, params, _ = run(LARS, kwargs, gen)
    full = {"momentum": 0.9, "weight_decay": 0.0, "trust_coefficient": 1e-3, "eps": 1e-8, **kwargs}
    reference = lars_reference(start, grads, **full)
    for p, r in zip(params, reference):
        if r.numel():
            assert (p.double() - r).norm() <= 1e-5 * r.norm()


@pytest.mark.parametrize(("opt_cls", "kwargs"), [(Lamb, {"lr": 1e-2}), (LARS, {"lr": 0.1})])
def test_identical_for_any_thread_count(opt_cls, kwargs) -> None:
    results = []
    saved = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            _, _, params, _ = run(opt_cls, kwargs, torch.Generator().manual_seed(7), steps=3)
            results.append([p.detach().clone() for p in params])
    finally:
        torch.set_num_threads(saved)
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


def test_zero_weights_take_a_plain_step() -> None:
    p = torch.zeros(100, requires_grad=True)
    p.grad = torch.ones(100)
    Lamb([p], lr=0.1).step()  # ||p|| = 0: trust 1, so p = -lr * u with u = 1 / (1 + eps)
    assert torch.allclose(p.detach(), torch.full((100,), -0.1), rtol=1e-5)


def test_state_dict_resumes_identically(gen: torch.Generator) -> None:
    _, _, params, opt = run(Lamb, {"lr": 1e-2, "weight_decay": 0.01}, gen, steps=5)
    twin = [p.detach().clone().requires_grad_() for p in params]
    resumed = Lamb(twin, lr=1.0)
    resumed.load_state_dict(copy.deepcopy(opt.state_dict()))
    assert resumed.param_groups[0]["lr"] == 1e-2
    for _ in range(3):
        for p, q in zip(params, twin):
            p.grad = torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        opt.step()
        resumed.step()
    assert all(torch.equal(p, q) for p, q in zip(params, twin))


@pytest.mark.parametrize(
    ("make_opt", "error", "message"),
    [
        (lambda p: Lamb([p], lr=float("inf")), ValueError, "must be finite"),
        (lambda p: Lamb([p], betas=(0.9, 1.0)), ValueError, "beta parameter at index 1"),
        (lambda p: LARS([p], trust_coefficient=-1.0), ValueError, "trust_coefficient"),
        (lambda p: LARS([p], nesterov=True, dampening=0.5), ValueError, "Nesterov"),
        (lambda p: LARS([p, p]), ValueError, "appears twice"),
    ],
)
def test_bad_construction(make_opt, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        make_opt(torch.zeros(3, requires_grad=True))
