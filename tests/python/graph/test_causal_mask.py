"""A causal mask handed to an attention node as a tensor (graph/causal_mask.py): recognized, bool or additive, so
the kernel runs its causal path (mask None, causal True), with the result of the mask's; anything else, however
close to the triangle, stays a mask."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from graphs import all_passes
from torch import nn

from ember import _C
from ember._optimize.graph import attention_node, causal_mask, fast_calls

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")
needs_sdpa = pytest.mark.skipif(not HAS_SDPA, reason="F.scaled_dot_product_attention: torch >= 2.0")


def _keep(size: int) -> torch.Tensor:
    return torch.ones(size, size, dtype=torch.bool).tril()


def _additive(size: int, dtype: torch.dtype, masked: float) -> torch.Tensor:
    return torch.zeros(size, size, dtype=dtype).masked_fill(~_keep(size), masked)


TRIANGLES = {
    "bool": lambda n: _keep(n),
    "bool batched": lambda n: _keep(n).expand(2, 1, n, n).clone(),
    "fp32 -inf": lambda n: _additive(n, torch.float32, float("-inf")),
    "fp32 lowest": lambda n: _additive(n, torch.float32, torch.finfo(torch.float32).min),
    "bf16 lowest": lambda n: _additive(n, torch.bfloat16, torch.finfo(torch.bfloat16).min)[None, None],
}


@pytest.mark.parametrize("name", list(TRIANGLES))
def test_the_triangle_is_recognized(name: str) -> None:
    assert causal_mask.is_causal_triangle(TRIANGLES[name](6), bool_mask_keeps=True)


def _flipped(n: int) -> torch.Tensor:
    m = _keep(n)
    m[4, 5] = True
    return m


def _one_batch_differs(n: int) -> torch.Tensor:
    m = _keep(n).expand(2, 1, n, n).clone()
    m[1, 0, 3, 0] = False
    return m


def _mixed(n: int) -> torch.Tensor:
    """-inf above the diagonal but for the first row's, the dtype's lowest (taken for neither triangle)."""
    m = _additive(n, torch.float32, float("-inf"))
    m[0, 1:] = torch.finfo(torch.float32).min
    return m


NOT_TRIANGLES = {
    "an element flipped": _flipped,
    "one batch differs": _one_batch_differs,
    "the other triangle": lambda n: _keep(n).t(),
    "a finite additive mask": lambda n: _additive(n, torch.float32, -1e4),
    "mixed masked values": lambda n: _additive(n, torch.float32, float("-inf")).index_fill_(
        0, torch.tensor([5]), -3e38
    ),
    "a bias on the diagonal": lambda n: _additive(n, torch.float32, float("-inf")) + torch.eye(n),
    "not square": lambda n: _keep(n)[:, :-1],
    "one row": lambda n: _keep(1),
    "integer": lambda n: _keep(n).int(),
}


@pytest.mark.parametrize("name", list(NOT_TRIANGLES))
def test_anything_else_is_not(name: str) -> None:
    assert not causal_mask.is_causal_triangle(NOT_TRIANGLES[name](6), bool_mask_keeps=True)


def test_a_bool_mask_added_as_numbers_is_not_a_triangle() -> None:
    assert not causal_mask.is_causal_triangle(_keep(6), bool_mask_keeps=False)


@pytest.fixture
def compared(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times the masks are compared with the triangles (causal_mask._compare), not answered from the memo."""
    count = [0]
    real = causal_mask._compare

    def counted(*args: Any) -> bool:
        count[0] += 1
        return real(*args)

    monkeypatch.setattr(causal_mask, "_compare", counted)
    return count


@torch.no_grad()  # (a guard passes with autograd off only)
def test_a_verdict_is_reused_within_one_guarded_forward_only(compared: list[int]) -> None:
    mask = _keep(8)
    with fast_calls.checked(fast_calls.GraphGuard([])):
        assert fast_calls.CHECKED.epoch != 0
        assert causal_mask.is_causal_triangle(mask, True)
        assert causal_mask.is_causal_triangle(mask[...], True)  # a view of the same memory
        assert compared[0] == 1
        other = _keep(8)
        other[7, 0] = False
        assert not causal_mask.is_causal_triangle(other, True)  # other memory: compared
        assert compared[0] == 2
        assert causal_mask.is_causal_triangle(mask, True)  # both remembered (a decoder alternates two masks)
        assert not causal_mask.is_causal_triangle(other, True)
        assert compared[0] == 2
    with fast_calls.checked(fast_calls.GraphGuard([])):  # the next forward: compared again
        mask[7, 0] = False  # (changed in place between forwards: an inference tensor has no version to tell)
        assert not causal_mask.is_causal_triangle(mask, True)
    assert compared[0] == 3
    assert causal_mask.is_causal_triangle(_keep(8), True) and compared[0] == 4  # outside a forward: no memo


@torch.no_grad()
def test_a_forward_remembers_a_few_masks(compared: list[int]) -> None:
    masks = [_keep(8) for _ in range(causal_mask._MEMO_MASKS + 1)]
    with fast_calls.checked(fast_calls.GraphGuard([])):
        for mask in masks[:-1] * 2:
            assert causal_mask.is_causal_triangle(mask, True)
        assert compared[0] == causal_mask._MEMO_MASKS
        assert causal_mask.is_causal_triangle(masks[-1], True)  # one more: the oldest verdict goes
        assert causal_mask.is_causal_triangle(masks[0], True)
        assert compared[0] == causal_mask._MEMO_MASKS + 2


class MaskedAttention(nn.Module):
    """A decoder's attention with its causal mask built as a tensor from positions, as Hugging Face's are."""

    def __init__(self, additive: bool) -> None:
        super().__init__()
        self.additive = additive

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(q.shape[-2])
        keep = positions[None, :] <= positions[:, None]
        if not self.additive:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        mask = torch.zeros(keep.shape, dtype=q.dtype).masked_fill(~keep, torch.finfo(q.dtype).min)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@needs_sdpa
@pytest.mark.parametrize("additive", [False, True], ids=["bool", "additive"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_kernel_runs_causal_with_the_masks_result(
    additive: bool, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 40, 16).to(dtype) for _ in range(3))  # past one 32-key block
    model = MaskedAttention(additive).eval()
    with torch.no_grad():
        gm = all_passes(model, (q, k, v))
        seen: list[tuple[bool, bool]] = []
        real = _C.scaled_dot_product_attention

        def recorded(q_: Any, k_: Any, v_: Any, mask: Any, causal: bool, *rest: Any) -> Any:
            seen.append((mask is None, causal))
            return real(q_, k_, v_, mask, causal, *rest)

        monkeypatch.setattr(attention_node, "_C", types.SimpleNamespace(scaled_dot_product_attention=recorded))
        with fast_calls.checked(fast_calls.GraphGuard([])):
            causal = gm(q, k, v)
        monkeypatch.setattr(causal_mask, "_compare", lambda *args: False)
        masked = gm(q, k, v)
        expected = model(q, k, v)
    assert seen == [(True, True), (False, False)]
    torch.testing.assert_close(causal, masked, rtol=1e-6, atol=1e-6)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(causal.float(), expected.float(), rtol=tol, atol=tol)
