"""ember.optim against torch.optim: same results (to rounding), same state, same API behaviour, clear errors."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import ember
from ember import _C
from ember.optim import LARS, SGD, Adagrad, Adam, AdamW

CASES = [
    (Adam, torch.optim.Adam, {"lr": 1e-2}),
    (Adam, torch.optim.Adam, {"lr": 1e-2, "weight_decay": 0.1, "amsgrad": True}),
    (Adam, torch.optim.Adam, {"lr": 3e-3, "betas": (0.8, 0.99), "eps": 1e-6, "maximize": True}),
    (AdamW, torch.optim.AdamW, {"lr": 1e-2}),
    (AdamW, torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.3, "amsgrad": True}),
    (SGD, torch.optim.SGD, {"lr": 1e-2}),
    (SGD, torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9, "dampening": 0.1, "weight_decay": 1e-3}),
    (SGD, torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9, "nesterov": True, "maximize": True}),
    (Adagrad, torch.optim.Adagrad, {"lr": 1e-2}),
    (
        Adagrad,
        torch.optim.Adagrad,
        {"lr": 5e-2, "lr_decay": 0.01, "weight_decay": 0.1, "initial_accumulator_value": 0.5},
    ),
]
CASE_IDS = [f"{e.__name__}-{'-'.join(f'{k}={v}' for k, v in kw.items())}" for e, _, kw in CASES]
SHAPES = [(1000,), (33, 7), (5,), (70_001,), (0,), (3, 1, 4)]


def make_params(gen: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(s, generator=gen).requires_grad_() for s in SHAPES]


def clone_params(params: list[torch.Tensor]) -> list[torch.Tensor]:
    return [p.detach().clone().requires_grad_() for p in params]


def set_grads(gen: torch.Generator, *param_lists: list[torch.Tensor]) -> None:
    for tensors in zip(*param_lists):
        g = torch.randn(tensors[0].shape, generator=gen)
        for p in tensors:
            p.grad = g.clone()


def assert_close_to_torch(ours: list[torch.Tensor], theirs: list[torch.Tensor], rtol: float = 1e-6) -> None:
    """Relative error of each tensor as a whole (norms), and a per-element bound of a few float32 ulps of the
    parameters' scale: 100 steps of rounding differences in a different (fused) evaluation order."""
    for a, b in zip(ours, theirs):
        if b.numel() == 0:
            continue
        assert (a - b).norm() <= rtol * b.norm(), f"relative error {((a - b).norm() / b.norm()).item():.3g}"
        assert (a - b).abs().max() <= 1e-5 * max(1.0, b.abs().max().item())


@pytest.mark.parametrize(("ember_cls", "torch_cls", "kwargs"), CASES, ids=CASE_IDS)
def test_100_steps_match_torch(isa_level: str, ember_cls, torch_cls, kwargs, gen: torch.Generator) -> None:
    ours = make_params(gen)
    theirs = clone_params(ours)
    a, b = ember_cls(ours, **kwargs), torch_cls(theirs, **kwargs)
    for _ in range(100):
        set_grads(gen, ours, theirs)
        a.step()
        b.step()
    assert_close_to_torch(ours, theirs)
    for p, q in zip(ours, theirs):
        assert a.state[p].keys() == b.state[q].keys()
        for key, value in b.state[q].items():
            mine = a.state[p][key]
            if isinstance(value, torch.Tensor) and value.numel() > 0:
                assert mine.shape == value.shape and mine.dtype == value.dtype, key
                assert (mine - value).norm() <= 1e-5 * max(value.norm().item(), 1e-12), key


def test_results_do_not_depend_on_thread_count(gen: torch.Generator) -> None:
    start = make_params(gen)
    grads = [[torch.randn(p.shape, generator=gen) for p in start] for _ in range(5)]
    results = []
    saved = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            params = clone_params(start)
            opt = Adam(params, lr=1e-2, weight_decay=0.01)
            for step_grads in grads:
                for p, g in zip(params, step_grads):
                    p.grad = g.clone()
                opt.step()
            results.append([p.detach().clone() for p in params])
    finally:
        torch.set_num_threads(saved)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b), "bitwise identical for any thread count"


@pytest.mark.parametrize(
    ("ember_cls", "torch_cls", "kwargs"),
    CASES[:1] + CASES[4:5] + CASES[6:7] + CASES[9:10],
    ids=CASE_IDS[:1] + CASE_IDS[4:5] + CASE_IDS[6:7] + CASE_IDS[9:10],
)
def test_state_dict_round_trips_with_torch(ember_cls, torch_cls, kwargs, gen: torch.Generator) -> None:
    # torch trains 10 steps, ember resumes from its checkpoint; a torch run resumed the same way is the reference.
    params = make_params(gen)
    torch_opt = torch_cls(params, **kwargs)
    for _ in range(10):
        set_grads(gen, params)
        torch_opt.step()
    checkpoint = copy.deepcopy(torch_opt.state_dict())
    ours, theirs = clone_params(params), clone_params(params)
    a, b = ember_cls(ours, **kwargs), torch_cls(theirs, **kwargs)
    a.load_state_dict(copy.deepcopy(checkpoint))  # load_state_dict keeps the tensors it is given: one copy each
    b.load_state_dict(copy.deepcopy(checkpoint))
    for _ in range(10):
        set_grads(gen, ours, theirs)
        a.step()
        b.step()
    assert_close_to_torch(ours, theirs)

    # ...and back: ember's checkpoint has torch's keys, shapes and dtypes and loads into torch.optim.
    ember_state = a.state_dict()
    torch_state = b.state_dict()
    assert ember_state["param_groups"] == torch_state["param_groups"]
    assert ember_state["state"].keys() == torch_state["state"].keys()
    for i, entry in torch_state["state"].items():
        assert entry.keys() == ember_state["state"][i].keys()
    resumed = clone_params(ours)
    c = torch_cls(resumed, **kwargs)
    c.load_state_dict(copy.deepcopy(ember_state))
    set_grads(gen, resumed, ours)
    c.step()
    a.step()
    assert_close_to_torch(ours, resumed)


def test_param_groups_frozen_params_and_later_groups(gen: torch.Generator) -> None:
    ours = make_params(gen)
    theirs = clone_params(ours)
    groups = lambda ps: [{"params": ps[:2], "lr": 1e-2}, {"params": ps[2:4], "weight_decay": 0.5}]  # noqa: E731
    a, b = Adam(groups(ours), lr=1e-3), torch.optim.Adam(groups(theirs), lr=1e-3)
    for step in range(12):
        set_grads(gen, ours, theirs)
        ours[1].grad = theirs[1].grad = None  # a parameter without a gradient is skipped
        if step == 5:
            a.add_param_group({"params": ours[4:], "lr": 5e-3, "amsgrad": True})
            b.add_param_group({"params": theirs[4:], "lr": 5e-3, "amsgrad": True})
        a.step()
        b.step()
    assert_close_to_torch(ours, theirs)
    assert len(a.state[ours[1]]) == 0
    assert a.state_dict()["param_groups"] == b.state_dict()["param_groups"]


def test_lr_scheduler_closure_and_zero_grad(gen: torch.Generator) -> None:
    w = torch.randn(20, generator=gen, requires_grad=True)
    w_ref = w.detach().clone().requires_grad_()
    x = torch.randn(64, 20, generator=gen)
    y = torch.randn(64, generator=gen)
    a, b = SGD([w], lr=0.1, momentum=0.9), torch.optim.SGD([w_ref], lr=0.1, momentum=0.9)
    sa, sb = torch.optim.lr_scheduler.StepLR(a, 3, 0.5), torch.optim.lr_scheduler.StepLR(b, 3, 0.5)
    for _ in range(10):
        for opt, weights in ((a, w), (b, w_ref)):

            def closure(opt=opt, weights=weights):
                opt.zero_grad(set_to_none=True)  # torch 1.13's default is False
                loss = ((x @ weights - y) ** 2).mean()
                loss.backward()
                return loss

            loss = opt.step(closure)
            assert isinstance(loss, torch.Tensor)
        sa.step()
        sb.step()
    assert a.param_groups[0]["lr"] == b.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**3)
    assert_close_to_torch([w], [w_ref])
    a.zero_grad(set_to_none=False)
    assert w.grad is not None and not w.grad.any()
    a.zero_grad(set_to_none=True)
    assert w.grad is None


def test_amp_scalars_unscale_and_skip(gen: torch.Generator) -> None:
    ours = make_params(gen)
    theirs = clone_params(ours)
    a, b = Adam(ours, lr=1e-2), torch.optim.Adam(theirs, lr=1e-2)
    set_grads(gen, ours, theirs)
    for p in ours:
        p.grad.mul_(1024.0)
    a.grad_scale, a.found_inf = torch.tensor(1024.0), torch.tensor(0.0)
    a.step()
    b.step()
    assert_close_to_torch(ours, theirs)
    before = [p.detach().clone() for p in ours]
    steps = [a.state[p]["step"].item() for p in ours]
    a.found_inf = torch.tensor(1.0)
    a.step()
    assert all(torch.equal(p, q) for p, q in zip(ours, before)), "a step with found_inf must change nothing"
    assert [a.state[p]["step"].item() for p in ours] == steps


@pytest.mark.skipif(not hasattr(torch.amp, "GradScaler"), reason="torch.amp.GradScaler for CPU needs torch >= 2.3")
def test_grad_scaler_drives_the_fused_step(gen: torch.Generator) -> None:
    w = torch.randn(50, generator=gen, requires_grad=True)
    w_ref = w.detach().clone().requires_grad_()
    x = torch.randn(32, 50, generator=gen)
    for opt_cls, weights in ((Adam, w), (torch.optim.Adam, w_ref)):
        opt = opt_cls([weights], lr=1e-2)
        scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
        for _ in range(5):
            opt.zero_grad()
            scaler.scale((x @ weights).pow(2).mean()).backward()
            scaler.step(opt)
            scaler.update()
    assert_close_to_torch([w], [w_ref])


# ----------------------------------------------------------------------------------------------------------------
# Bad input: clear errors, nothing touched


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda p: Adam([p], lr=-1.0), ValueError, "Invalid learning rate"),
        (lambda p: Adam([p], lr=float("nan")), ValueError, "must be finite"),
        (lambda p: Adam([p], betas=(1.0, 0.9)), ValueError, "beta parameter at index 0"),
        (lambda p: Adam([p], eps=float("inf")), ValueError, "must be finite"),
        (lambda p: SGD([p], momentum=-0.5), ValueError, "Invalid momentum"),
        (lambda p: SGD([p], nesterov=True), ValueError, "Nesterov momentum requires"),
        (lambda p: Adam([p, p]), ValueError, "appears twice"),
        (lambda p: Adam([torch.zeros(3, dtype=torch.int64)]), TypeError, "must be float32"),
        (lambda p: Adam([torch.zeros(3, dtype=torch.float64, requires_grad=True)]), TypeError, "float32 or bfloat16"),
        (lambda p: LARS([torch.zeros(3, dtype=torch.float16, requires_grad=True)]), TypeError, "float32 or bfloat16"),
        (lambda p: Adam([torch.zeros(3, device="meta")]), ValueError, "must be a CPU tensor"),
        (lambda p: Adam([p], capturable=True), NotImplementedError, "capturable"),
    ],
)
def test_bad_construction(make, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        make(torch.zeros(3, requires_grad=True))


def test_bad_hyperparameter_at_step_touches_nothing(gen: torch.Generator) -> None:
    params = make_params(gen)
    opt = Adam(params, lr=1e-2)
    set_grads(gen, params)
    opt.step()
    before = copy.deepcopy(opt.state_dict())
    values = [p.detach().clone() for p in params]
    opt.param_groups[0]["lr"] = float("nan")
    set_grads(gen, params)
    with pytest.raises(ValueError, match="learning rate"):
        opt.step()
    assert all(torch.equal(p, v) for p, v in zip(params, values))
    assert opt.state_dict()["state"][0]["step"] == before["state"][0]["step"]


# torch 2.x's own sparse ops warn about its invariant checks; that is torch's business, not this test's.
@pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled")
def test_sparse_gradients() -> None:
    emb = torch.nn.Embedding(10, 3, sparse=True)
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="does not support sparse gradients"):
        Adam(emb.parameters()).step()

    # SGD and Adagrad support them, as torch.optim does: same results and state as torch, beside dense params.
    for ember_cls, torch_cls, kwargs in (
        (SGD, torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),  # torch itself refuses weight_decay here
        (SGD, torch.optim.SGD, {"lr": 0.1}),
        (Adagrad, torch.optim.Adagrad, {"lr": 0.1}),
    ):
        models = []
        for _ in range(2):
            torch.manual_seed(0)
            models.append(
                torch.nn.ModuleDict({"emb": torch.nn.Embedding(50, 4, sparse=True), "lin": torch.nn.Linear(4, 1)})
            )
        ours, theirs = ember_cls(models[0].parameters(), **kwargs), torch_cls(models[1].parameters(), **kwargs)
        for step in range(5):
            idx = torch.tensor([step, step + 3, 7, 7])
            for model, opt in ((models[0], ours), (models[1], theirs)):
                opt.zero_grad()
                model["lin"](model["emb"](idx)).sum().backward()
                opt.step()
        for a, b in zip(models[0].parameters(), models[1].parameters()):
            assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)
        assert ours.state_dict()["state"].keys() == theirs.state_dict()["state"].keys()


def test_kernel_entry_checks_write_nothing() -> None:
    from torch.utils.dlpack import to_dlpack as dl

    p = torch.ones(8)
    g = torch.ones(8)
    m, v = torch.zeros(8), torch.zeros(8)
    step = torch.zeros(())
    kwargs = {"lr": 0.1, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}
    kwargs.update(decoupled_weight_decay=False, amsgrad=False, maximize=False)

    def call(params=None, grads=None, exp_avgs=None, exp_avg_sqs=None, steps=None, **extra):
        _C.adam_step(
            params or [dl(p)], grads or [dl(g)], exp_avgs or [dl(m)], exp_avg_sqs or [dl(v)], [],
            steps or [dl(step)], _C.AdamOptions(**{**kwargs, **extra}),
        )  # fmt: skip

    with pytest.raises(ValueError, match=r"grads\[0\] must have the shape and memory layout of params\[0\]"):
        call(grads=[dl(torch.ones(4))])
    with pytest.raises(TypeError, match=r"exp_avgs\[0\] must have dtype float32, got float64"):
        call(exp_avgs=[dl(torch.zeros(8, dtype=torch.float64))])
    with pytest.raises(ValueError, match=r"exp_avg_sqs\[0\] and params\[0\] share memory|params\[0\] and exp_avg_sqs"):
        call(exp_avg_sqs=[dl(p)])
    with pytest.raises(ValueError, match="steps must hold 1 tensors, got 2"):
        call(steps=[dl(step), dl(torch.zeros(()))])
    with pytest.raises(ValueError, match=r"params\[1\] and params\[0\] share memory|params\[0\] and params\[1\]"):
        _C.adam_step([dl(p), dl(p[2:])], [dl(g), dl(g[2:])], [dl(m), dl(torch.zeros(6))],
                     [dl(v), dl(torch.zeros(6))], [], [dl(step), dl(torch.zeros(()))],
                     _C.AdamOptions(**kwargs))  # fmt: skip
    with pytest.raises(ValueError, match="betas\\[1\\] must be in"):
        call(beta2=1.5)
    with pytest.raises(ValueError, match=r"params\[0\] must be dense"):
        call(params=[dl(torch.ones(16)[::2])])
    with pytest.raises(ValueError, match=r"grads\[0\] must have the shape and memory layout"):
        q = torch.ones(2, 4)
        call(params=[dl(q)], grads=[dl(torch.ones(4, 2).t())], exp_avgs=[dl(torch.zeros(2, 4))],
             exp_avg_sqs=[dl(torch.zeros(2, 4))])  # fmt: skip
    assert torch.equal(p, torch.ones(8)) and not m.any() and not v.any() and step.item() == 0.0


def test_verbose_log_names_the_path(capfd: pytest.CaptureFixture[str]) -> None:
    p = torch.zeros(10, requires_grad=True)
    p.grad = torch.ones(10)
    ember.isa.set_verbose(True)
    try:
        Adam([p]).step()
    finally:
        ember.isa.set_verbose(False)
    assert f"ember_verbose,optim.adam,{_C.bf16_implementation('split')},tensors=1,n=10" in capfd.readouterr().err


def test_step_count_is_torchs_float_tensor(gen: torch.Generator) -> None:
    params = make_params(gen)
    opt = AdamW(params)
    for _ in range(3):
        set_grads(gen, params)
        opt.step()
    step = opt.state[params[0]]["step"]
    assert isinstance(step, torch.Tensor) and step.dtype == torch.float32 and step.item() == 3.0
    assert math.isclose(opt.param_groups[0]["weight_decay"], 1e-2)


def test_moved_tensors_are_noticed_between_steps(gen: torch.Generator) -> None:
    # ember reuses the DLPack views of parameters and state from step to step; anything that moves a tensor to
    # other memory (p.data = ..., load_state_dict, a replaced state entry) must be seen, not written through.
    ours = make_params(gen)
    theirs = clone_params(ours)
    a, b = Adam(ours, lr=1e-2), torch.optim.Adam(theirs, lr=1e-2)
    for step in range(6):
        set_grads(gen, ours, theirs)
        if step == 2:
            for p, q in zip(ours, theirs):
                p.data = p.data.clone()
                q.data = q.data.clone()
        if step == 4:
            for p, q in zip(ours, theirs):
                a.state[p]["exp_avg"] = a.state[p]["exp_avg"].clone()
                b.state[q]["exp_avg"] = b.state[q]["exp_avg"].clone()
        a.step()
        b.step()
    assert_close_to_torch(ours, theirs)
    clone = copy.deepcopy(a)  # the cached views are not copied along
    assert_close_to_torch(clone.param_groups[0]["params"], ours)


@pytest.mark.parametrize(
    ("ember_cls", "torch_cls", "kwargs"),
    [
        (Adam, torch.optim.Adam, {"lr": 1e-2, "amsgrad": True}),
        (SGD, torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9, "dampening": 0.5}),
        (SGD, torch.optim.SGD, {"lr": 1e-2}),
    ],
    ids=["adam-amsgrad", "sgd-momentum", "sgd"],
)
def test_refused_first_step_creates_no_state(ember_cls, torch_cls, kwargs, gen: torch.Generator) -> None:
    # The kernel refuses a gradient that shares the parameter's memory. The state the step had created for it
    # (zero moments; SGD's momentum buffer, which the first step sets instead of updating) is taken back, so the
    # next, valid step is a first step exactly as torch's.
    ours = make_params(gen)
    theirs = clone_params(ours)
    opt, reference = ember_cls(ours, **kwargs), torch_cls(theirs, **kwargs)
    values = [p.detach().clone() for p in ours]
    set_grads(gen, ours)
    ours[1].grad = ours[1].detach()
    with pytest.raises(ValueError, match=r"(params|grads)\[1\] and (grads|params)\[1\] share memory"):
        opt.step()
    assert opt.state_dict()["state"] == {}
    assert all(torch.equal(p, v) for p, v in zip(ours, values))
    for _ in range(3):
        set_grads(gen, ours, theirs)
        opt.step()
        reference.step()
    assert_close_to_torch(ours, theirs)
    assert opt.state_dict()["state"].keys() == reference.state_dict()["state"].keys()


def test_cached_plan_follows_group_and_state_changes(gen: torch.Generator) -> None:
    # Between steps: a parameter loses its gradient, another gains one, amsgrad is switched on (new state entry),
    # a step count is an old checkpoint's Python number, a state dict is replaced. Each must reach the kernel.
    ours = make_params(gen)
    theirs = clone_params(ours)
    a, b = Adam(ours, lr=1e-2), torch.optim.Adam(theirs, lr=1e-2)
    for step in range(7):
        set_grads(gen, ours, theirs)
        if step == 1:
            ours[0].grad = theirs[0].grad = None
        if step == 3:
            a.state[ours[2]]["step"] = a.state[ours[2]]["step"].item()
        if step == 4:
            a.state[ours[3]] = {k: v.clone() for k, v in a.state[ours[3]].items()}
        a.step()
        b.step()
        if step == 5:
            a.param_groups[0]["amsgrad"] = b.param_groups[0]["amsgrad"] = True
            for q in theirs:  # torch needs the entries in place; ember creates them
                b.state[q]["max_exp_avg_sq"] = torch.zeros_like(q)
    assert_close_to_torch(ours, theirs)
    for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
        assert_close_to_torch([a.state[p][key] for p in ours], [b.state[q][key] for q in theirs])
    assert [a.state[p]["step"] for p in ours] == [b.state[q]["step"] for q in theirs]


def test_adagrad_state_exists_from_construction_like_torch(gen: torch.Generator) -> None:
    ours = make_params(gen)
    theirs = clone_params(ours)
    a = Adagrad(ours, initial_accumulator_value=0.25)
    b = torch.optim.Adagrad(theirs, initial_accumulator_value=0.25)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert sa["state"].keys() == sb["state"].keys()
    assert all(torch.equal(sa["state"][i]["sum"], sb["state"][i]["sum"]) for i in sb["state"])


def test_channels_last_parameters(gen: torch.Generator) -> None:
    # Dense but permuted parameters (what channels-last convolutions have) are updated in place, in their layout,
    # whatever the layout of their gradients.
    weights = [torch.randn(8, 3, 5, 5, generator=gen).to(memory_format=torch.channels_last).requires_grad_()]
    theirs = [w.detach().clone().requires_grad_() for w in weights]
    a, b = Adam(weights, lr=1e-2), torch.optim.Adam(theirs, lr=1e-2)
    for step in range(5):
        g = torch.randn(8, 3, 5, 5, generator=gen)
        weights[0].grad = g.clone() if step % 2 else g.to(memory_format=torch.channels_last)
        theirs[0].grad = g.clone()
        a.step()
        b.step()
    assert weights[0].is_contiguous(memory_format=torch.channels_last)
    assert a.state[weights[0]]["exp_avg"].is_contiguous(memory_format=torch.channels_last)
    assert_close_to_torch(weights, theirs)


BF16_CASES = [
    (Adam, torch.optim.Adam, {"lr": 1e-2}),
    (Adam, torch.optim.Adam, {"lr": 1e-2, "weight_decay": 0.1, "amsgrad": True}),
    (AdamW, torch.optim.AdamW, {"lr": 1e-2}),
    (SGD, torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9, "weight_decay": 1e-3}),
    (Adagrad, torch.optim.Adagrad, {"lr": 1e-2, "initial_accumulator_value": 0.1}),
]


@pytest.mark.parametrize(("ember_cls", "torch_cls", "kwargs"), BF16_CASES, ids=[c[0].__name__ for c in BF16_CASES])
def test_bf16_parameters_keep_fp32_state(isa_level: str, ember_cls, torch_cls, kwargs, gen: torch.Generator) -> None:
    # Reference: torch.optim.Adam on an fp32 copy, the parameter rounded to bf16 after every step (what ember's
    # one pass does: widen, update in fp32, round to nearest even).
    ours = [torch.randn(s, generator=gen).to(torch.bfloat16).requires_grad_() for s in SHAPES]
    reference = [p.detach().float().requires_grad_() for p in ours]
    a, b = ember_cls(ours, **kwargs), torch_cls(reference, **kwargs)
    for _ in range(20):
        for p, r in zip(ours, reference):
            g = torch.randn(p.shape, generator=gen).to(torch.bfloat16)
            p.grad, r.grad = g, g.float()
        a.step()
        b.step()
        with torch.no_grad():
            for r in reference:
                r.copy_(r.to(torch.bfloat16).float())
    for p, r in zip(ours, reference):
        assert p.dtype == torch.bfloat16
        assert all(v.dtype == torch.float32 for k, v in a.state[p].items() if k != "step" and v is not None)
        if p.numel():
            # One bf16 rounding apart at most: the fp32 values differ by float32 rounding, which can flip a tie.
            assert ((p.float() - r).abs() <= r.abs() * 2**-8 + 1e-30).all()


@pytest.mark.skipif(not hasattr(torch.optim.Optimizer, "register_step_pre_hook"), reason="step hooks: torch >= 2.0")
def test_step_hooks_run_as_in_torch(gen: torch.Generator) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    params = make_params(gen)
    opt = Adam(params, lr=1e-2)
    calls: list[str] = []
    handles = [
        register_optimizer_step_pre_hook(lambda o, a, k: calls.append("global-pre")),
        opt.register_step_pre_hook(lambda o, a, k: calls.append("pre")),
        opt.register_step_post_hook(lambda o, a, k: calls.append(f"post-{a[1] is not None}")),
        register_optimizer_step_post_hook(lambda o, a, k: calls.append("global-post")),
    ]
    # A pre-hook may replace the arguments: here it supplies a closure.
    handles.append(opt.register_step_pre_hook(lambda o, a, k: ((o, lambda: torch.tensor(7.0)), k)))
    try:
        set_grads(gen, params)
        assert opt.step().item() == 7.0
    finally:
        for handle in handles:
            handle.remove()
    assert calls == ["global-pre", "pre", "post-True", "global-post"]
    assert type(opt).step is ember.optim.FusedOptimizer.step, "torch must not wrap ember's step again"


def test_profiler_sees_the_step(gen: torch.Generator) -> None:
    params = make_params(gen)
    opt = SGD(params, lr=0.1)
    set_grads(gen, params)
    with torch.autograd.profiler.profile() as prof:
        opt.step()
    assert any(e.name == "Optimizer.step#SGD.step" for e in prof.function_events)
