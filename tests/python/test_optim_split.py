"""bf16 and split-BF16 parameters in every ember optimizer: exactness, state, checkpoints, errors.

A split-BF16 parameter is an fp32 master weight held as a bf16 top half (the parameter) and an int16 bottom half
(kept by the optimizer). The kernels join, update in fp32 and split in one pass, so with the same (bf16-valued)
gradients a split run must equal an fp32 run bit for bit, and a bf16 run must equal an fp32 run that rounds the
weights to bf16 after every step.
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch.utils.dlpack import to_dlpack as dl

import ember
from ember import _C
from ember.optim import LARS, SGD, Adagrad, Adam, AdamW, Lamb

CASES = [
    (Adam, {"lr": 1e-2}),
    (Adam, {"lr": 1e-2, "weight_decay": 0.1, "amsgrad": True, "maximize": True}),
    (AdamW, {"lr": 1e-2, "weight_decay": 0.3}),
    (SGD, {"lr": 1e-2}),
    (SGD, {"lr": 1e-2, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3}),
    (Adagrad, {"lr": 5e-2, "lr_decay": 0.01, "weight_decay": 0.1, "initial_accumulator_value": 0.5}),
    (Lamb, {"lr": 1e-2, "weight_decay": 0.01}),
    (LARS, {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4}),
]
CASE_IDS = [f"{c.__name__}-{'-'.join(f'{k}={v}' for k, v in kw.items())}" for c, kw in CASES]
# Lengths that are not multiples of any vector width, a tensor over the parallel grain, an empty one, and a
# channels-last conv weight (split in its own layout).
SHAPES = [(1000,), (33, 7), (5,), (70_001,), (0,), (8, 3, 5, 5)]


def make_params(gen: torch.Generator) -> list[torch.Tensor]:
    params = [torch.randn(s, generator=gen) for s in SHAPES]
    params[-1] = params[-1].contiguous(memory_format=torch.channels_last)
    return [p.requires_grad_() for p in params]


def twin(params: list[torch.Tensor]) -> list[torch.Tensor]:
    return [p.detach().clone(memory_format=torch.preserve_format).requires_grad_() for p in params]


def bf16_grads(gen: torch.Generator, params: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.randn(p.shape, generator=gen).to(torch.bfloat16) for p in params]


@pytest.mark.parametrize(("opt_cls", "kwargs"), CASES, ids=CASE_IDS)
def test_split_parameters_train_exactly_like_fp32(isa_level: str, opt_cls, kwargs, gen: torch.Generator) -> None:
    reference = make_params(gen)
    params = twin(reference)
    a, b = opt_cls(reference, **kwargs), opt_cls(params, **kwargs)
    # Every other parameter split: one group then holds fp32 and split slots side by side.
    b.split_master_weights(params[::2])
    assert [p.dtype for p in params] == [torch.bfloat16, torch.float32] * 3
    for _ in range(10):
        for p, r, g in zip(params, reference, bf16_grads(gen, params)):
            r.grad = g.float()
            p.grad = g if b.is_split(p) else g.float()
        a.step()
        b.step()
    for p, r in zip(params, reference):
        assert torch.equal(b.master_weight(p), r.detach()), "split-BF16 must be the fp32 result bit for bit"
        if b.is_split(p):
            assert p.stride() == r.stride(), "the top half keeps the parameter's memory layout"
            # The parameter the model sees is the truncated top half of the master weight.
            assert torch.equal(p.detach(), ember.bf16.split(r.detach())[0])
        for key, value in a.state[r].items():
            mine = b.state[p][key]
            assert torch.equal(mine, value) if isinstance(value, torch.Tensor) else mine is value, key


@pytest.mark.parametrize(("opt_cls", "kwargs"), CASES, ids=CASE_IDS)
def test_bf16_parameters_round_once_per_step(isa_level: str, opt_cls, kwargs, gen: torch.Generator) -> None:
    # The reference is ember's fp32 step (checked against torch and float64 elsewhere) on the widened bf16
    # values, rounded to nearest even afterwards: what the bf16 kernels must do in their one pass.
    params = [p.detach().to(torch.bfloat16).requires_grad_() for p in make_params(gen)]
    reference = [p.detach().float().requires_grad_() for p in params]
    a, b = opt_cls(reference, **kwargs), opt_cls(params, **kwargs)
    for _ in range(10):
        for p, r, g in zip(params, reference, bf16_grads(gen, params)):
            p.grad, r.grad = g, g.float()
        a.step()
        b.step()
        with torch.no_grad():
            for r in reference:
                r.copy_(r.to(torch.bfloat16).float())
    for p, r in zip(params, reference):
        assert p.dtype == torch.bfloat16
        assert torch.equal(p.detach().float(), r.detach())
        assert all(v.dtype == torch.float32 for k, v in b.state[p].items() if k != "step" and v is not None)


def test_split_and_join_round_trip_every_bit_pattern(gen: torch.Generator) -> None:
    bits = torch.randint(-(2**31), 2**31 - 1, (4096,), dtype=torch.int32, generator=gen)
    bits[:4] = torch.tensor([0x7FC00001, -0x00000001, 0x00000001, -(2**31)], dtype=torch.int32)  # NaNs, denormal, -0
    values = bits.view(torch.float32).clone().requires_grad_()
    opt = Adam([values])
    original = values.detach().clone()
    opt.split_master_weights()
    assert opt.is_split(values) and values.dtype == torch.bfloat16
    assert torch.equal(opt.master_weight(values).view(torch.int32), bits)
    replacement = torch.randn(4096, generator=gen)
    opt.set_master_weight(values, replacement)
    assert torch.equal(opt.master_weight(values), replacement)
    opt.set_master_weight(values, original)
    values.grad = torch.ones(4096, dtype=torch.bfloat16)
    opt.join_master_weights()
    assert not opt.is_split(values)
    assert values.dtype == torch.float32 and values.grad.dtype == torch.float32
    assert torch.equal(values.detach().view(torch.int32), bits)


def test_split_converts_an_existing_gradient_and_skips_bf16_parameters(gen: torch.Generator) -> None:
    p = torch.randn(10, generator=gen, requires_grad=True)
    q = torch.randn(10, generator=gen).to(torch.bfloat16).requires_grad_()
    p.grad = torch.randn(10, generator=gen)
    opt = SGD([p, q], lr=0.1)
    opt.split_master_weights()  # all: q has no fp32 value to keep and stays plain bf16
    assert p.grad.dtype == torch.bfloat16 and opt.is_split(p) and not opt.is_split(q)
    opt.split_master_weights()  # a second time changes nothing
    assert opt.is_split(p)


def test_split_state_dict_is_torchs_and_resumes_bit_identically(gen: torch.Generator) -> None:
    start = make_params(gen)
    grads = [bf16_grads(gen, start) for _ in range(8)]

    def run(params, opt, steps):
        for step_grads in steps:
            for p, g in zip(params, step_grads):
                p.grad = g if opt.is_split(p) else g.float()
            opt.step()

    # Uninterrupted fp32 run.
    plain = twin(start)
    plain_opt = AdamW(plain, lr=1e-2, weight_decay=0.1)
    run(plain, plain_opt, grads)

    # Split run, checkpointed after 4 steps as plain fp32 weights and a torch-format optimizer state.
    split = twin(start)
    split_opt = AdamW(split, lr=1e-2, weight_decay=0.1)
    split_opt.split_master_weights()
    run(split, split_opt, grads[:4])
    buffer = io.BytesIO()
    torch.save({"weights": [split_opt.master_weight(p) for p in split], "optim": split_opt.state_dict()}, buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer)

    # The checkpoint is torch.optim's: it loads into torch.optim.AdamW on fp32 parameters.
    fp32 = [w.clone().requires_grad_() for w in checkpoint["weights"]]
    torch_opt = torch.optim.AdamW(fp32, lr=1e-2, weight_decay=0.1)
    torch_opt.load_state_dict(copy.deepcopy(checkpoint["optim"]))
    assert all(v.dtype == torch.float32 for s in torch_opt.state.values() for v in s.values())

    # Resumed into a fresh split optimizer: exactly the uninterrupted run.
    resumed = twin(start)
    resumed_opt = AdamW(resumed, lr=1e-2, weight_decay=0.1)
    resumed_opt.split_master_weights()
    resumed_opt.load_state_dict(checkpoint["optim"])
    for p, w in zip(resumed, checkpoint["weights"]):
        resumed_opt.set_master_weight(p, w)
    run(resumed, resumed_opt, grads[4:])
    for p, q in zip(resumed, plain):
        assert torch.equal(resumed_opt.master_weight(p), q.detach())


def test_bf16_parameters_load_their_state_at_full_precision(gen: torch.Generator) -> None:
    # torch's load_state_dict casts state to the parameter's dtype; ember keeps bf16 parameters' state in fp32,
    # so loading its own checkpoint (or torch's) must not round the moments to bf16.
    params = [p.detach().to(torch.bfloat16).requires_grad_() for p in make_params(gen)]
    grads = [bf16_grads(gen, params) for _ in range(6)]
    opt = Adam(params, lr=1e-2)
    for i, step_grads in enumerate(grads):
        for p, g in zip(params, step_grads):
            p.grad = g
        opt.step()
        if i == 2:
            saved = copy.deepcopy(opt.state_dict())
            at_save = [p.detach().clone() for p in params]
    resumed = [w.clone().requires_grad_() for w in at_save]
    resumed_opt = Adam(resumed, lr=1e-2)
    resumed_opt.load_state_dict(saved)
    for p in resumed:
        assert all(v.dtype == torch.float32 for k, v in resumed_opt.state[p].items() if k != "step")
    for step_grads in grads[3:]:
        for p, g in zip(resumed, step_grads):
            p.grad = g
        resumed_opt.step()
    assert all(torch.equal(p, q) for p, q in zip(resumed, params))


def test_deepcopy_and_pickle_carry_the_bottom_halves(gen: torch.Generator) -> None:
    params = make_params(gen)
    opt = Lamb(params, lr=1e-2)
    opt.split_master_weights()
    for make_copy in (copy.deepcopy, _pickled):
        copied = make_copy(opt)
        copied_params = [p for group in copied.param_groups for p in group["params"]]
        for p, q in zip(params, copied_params):
            assert copied.is_split(q)
            assert torch.equal(copied.master_weight(q), opt.master_weight(p))
        grads = bf16_grads(gen, params)
        for p, q, g in zip(params, copied_params, grads):
            p.grad, q.grad = g, g.clone()
        before = [opt.master_weight(p) for p in params]
        copied.step()
        assert all(torch.equal(opt.master_weight(p), b) for p, b in zip(params, before)), "the copy is separate"
        opt.step()
        for p, q in zip(params, copied_params):
            assert torch.equal(copied.master_weight(q), opt.master_weight(p))


def _pickled(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    buffer = io.BytesIO()
    torch.save(opt, buffer)
    buffer.seek(0)
    try:
        return torch.load(buffer, weights_only=False)
    except TypeError:  # torch 1.13 has no weights_only
        buffer.seek(0)
        return torch.load(buffer)


def test_found_inf_skips_the_step_for_split_parameters(gen: torch.Generator) -> None:
    params = make_params(gen)
    opt = Adam(params, lr=1e-2)
    opt.split_master_weights()
    for p, g in zip(params, bf16_grads(gen, params)):
        p.grad = g
    before = [opt.master_weight(p) for p in params]
    opt.grad_scale, opt.found_inf = torch.tensor(8.0), torch.tensor(1.0)
    opt.step()
    assert all(torch.equal(opt.master_weight(p), b) for p, b in zip(params, before))


def test_split_results_do_not_depend_on_thread_count(gen: torch.Generator) -> None:
    start = make_params(gen)
    grads = [bf16_grads(gen, start) for _ in range(4)]
    results = []
    saved = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            for opt_cls, kwargs in ((Adam, {"lr": 1e-2}), (LARS, {"lr": 0.1})):
                params = twin(start)
                opt = opt_cls(params, **kwargs)
                opt.split_master_weights()
                for step_grads in grads:
                    for p, g in zip(params, step_grads):
                        p.grad = g
                    opt.step()
                results.append((threads, opt_cls, [opt.master_weight(p) for p in params]))
    finally:
        torch.set_num_threads(saved)
    for threads, opt_cls, weights in results[2:]:
        first = next(w for t, c, w in results if c is opt_cls)
        assert all(torch.equal(a, b) for a, b in zip(weights, first)), (threads, opt_cls.__name__)


@pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled")
def test_sparse_gradients_of_split_parameters_are_refused() -> None:
    table = torch.nn.Embedding(10, 4, sparse=True)
    opt = SGD(table.parameters(), lr=0.1)
    opt.split_master_weights()
    table(torch.tensor([1, 2])).sum().backward()
    before = opt.master_weight(table.weight)
    with pytest.raises(NotImplementedError, match="sparse gradients of split-BF16 parameters"):
        opt.step()
    assert torch.equal(opt.master_weight(table.weight), before)


def test_bad_split_requests() -> None:
    p = torch.zeros(3, requires_grad=True)
    q = torch.zeros(3, dtype=torch.bfloat16, requires_grad=True)
    opt = Adam([p, q])
    with pytest.raises(ValueError, match=r"params\[0\] is not a parameter of this optimizer"):
        opt.split_master_weights([torch.zeros(3)])
    with pytest.raises(TypeError, match=r"a float32 parameter is needed, got torch\.bfloat16"):
        opt.split_master_weights([q])
    opt.split_master_weights([p])
    with pytest.raises(ValueError, match=r"value must be a tensor of shape \(3,\)"):
        opt.set_master_weight(p, torch.zeros(4))
    assert opt.is_split(p) and not opt.is_split(q)


def test_kernel_entry_checks_bottoms_and_writes_nothing() -> None:
    top = torch.ones(8, dtype=torch.bfloat16)
    bottom = torch.zeros(8, dtype=torch.int16)
    g = torch.ones(8, dtype=torch.bfloat16)
    m, v = torch.zeros(8), torch.zeros(8)
    step = torch.zeros(())
    kwargs = {"lr": 0.1, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}
    kwargs.update(decoupled_weight_decay=False, amsgrad=False, maximize=False)

    def call(bottoms, params=None, grads=None):
        _C.adam_step(params or [dl(top)], grads or [dl(g)], [dl(m)], [dl(v)], [], [dl(step)], _C.AdamOptions(**kwargs),
                     bottoms=bottoms)  # fmt: skip

    with pytest.raises(TypeError, match=r"bottoms\[0\] must have dtype int16, got int32"):
        call([dl(torch.zeros(8, dtype=torch.int32))])
    with pytest.raises(ValueError, match=r"bottoms\[0\] must have the shape and memory layout of params\[0\]"):
        call([dl(torch.zeros(4, dtype=torch.int16))])
    with pytest.raises(TypeError, match=r"params\[0\] must be bfloat16 \(the top half\) when bottoms\[0\] is given"):
        call([dl(bottom)], params=[dl(torch.ones(8))], grads=[dl(torch.ones(8))])
    with pytest.raises(ValueError, match="bottoms must be empty or hold 1 entries"):
        call([dl(bottom), None])
    with pytest.raises(ValueError, match="share memory"):
        call([dl(g.view(torch.int16))])
    assert torch.equal(top, torch.ones(8, dtype=torch.bfloat16)) and not bottom.any()
    assert not m.any() and not v.any() and step.item() == 0.0
    call([None])  # None: a plain bf16 slot
    call([dl(bottom)])
    assert step.item() == 2.0 and bottom.any()


def test_bf16_split_and_join_keep_a_dense_layout(gen: torch.Generator) -> None:
    x = torch.randn(4, 3, 5, 6, generator=gen).contiguous(memory_format=torch.channels_last)
    top, bottom = ember.bf16.split(x)
    assert top.stride() == x.stride() and bottom.stride() == x.stride()
    joined = ember.bf16.join(top, bottom)
    assert joined.stride() == x.stride() and torch.equal(joined, x)
    strided = torch.randn(6, 8, generator=gen)[:, ::2]  # not dense: copied, results contiguous
    top, bottom = ember.bf16.split(strided)
    assert top.is_contiguous() and torch.equal(ember.bf16.join(top, bottom), strided)
