"""Masks handed to an attention node as tensors (graph/known_masks.py): the causal triangle, bool or additive, is
recognized, so the kernel runs its causal path (mask None, causal True), and a mask that keeps every score is dropped
(mask None), each with the result of the mask's; anything else, however close, stays a mask."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from graphs import all_passes
from torch import nn

from ember import _C
from ember._optimize.graph import attention_node, fast_calls, known_masks
from ember._optimize.graph.known_masks import KnownMask

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
    assert known_masks.recognize(TRIANGLES[name](6), bool_mask_keeps=True) is KnownMask.CAUSAL


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
    "integer": lambda n: _keep(n).int(),
}


@pytest.mark.parametrize("name", list(NOT_TRIANGLES))
def test_anything_else_is_not(name: str) -> None:
    assert known_masks.recognize(NOT_TRIANGLES[name](6), bool_mask_keeps=True) is KnownMask.OTHER


def test_a_bool_mask_added_as_numbers_is_not_a_triangle() -> None:
    assert known_masks.recognize(_keep(6), bool_mask_keeps=False) is KnownMask.OTHER
    assert known_masks.recognize(torch.ones(6, 6, dtype=torch.bool), bool_mask_keeps=False) is KnownMask.OTHER


@pytest.fixture
def compared(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times the masks are compared with the triangles (known_masks._compare), not answered from the memo."""
    count = [0]
    real = known_masks._compare

    def counted(*args: Any) -> KnownMask:
        count[0] += 1
        return real(*args)

    monkeypatch.setattr(known_masks, "_compare", counted)
    return count


@torch.no_grad()  # (a guard passes with autograd off only)
def test_a_verdict_is_reused_within_one_guarded_forward_only(compared: list[int]) -> None:
    mask = _keep(8)
    with fast_calls.checked(fast_calls.GraphGuard([])):
        assert fast_calls.CHECKED.epoch != 0
        assert known_masks.recognize(mask, True) is KnownMask.CAUSAL
        assert known_masks.recognize(mask[...], True) is KnownMask.CAUSAL  # a view of the same memory
        assert compared[0] == 1
        other = _keep(8)
        other[7, 0] = False
        assert known_masks.recognize(other, True) is KnownMask.OTHER  # other memory: compared
        assert compared[0] == 2
        assert known_masks.recognize(mask, True) is KnownMask.CAUSAL  # both remembered (a decoder alternates two masks)
        assert known_masks.recognize(other, True) is KnownMask.OTHER
        assert compared[0] == 2
    with fast_calls.checked(fast_calls.GraphGuard([])):  # the next forward: compared again
        mask[7, 0] = False  # (changed in place between forwards: an inference tensor has no version to tell)
        assert known_masks.recognize(mask, True) is KnownMask.OTHER
    assert compared[0] == 3
    assert known_masks.recognize(_keep(8), True) is KnownMask.CAUSAL and compared[0] == 4  # outside a forward: no memo


@torch.no_grad()
def test_a_forward_remembers_a_few_masks(compared: list[int]) -> None:
    masks = [_keep(8) for _ in range(known_masks._MEMO_MASKS + 1)]
    with fast_calls.checked(fast_calls.GraphGuard([])):
        for mask in masks[:-1] * 2:
            assert known_masks.recognize(mask, True) is KnownMask.CAUSAL
        assert compared[0] == known_masks._MEMO_MASKS
        assert known_masks.recognize(masks[-1], True) is KnownMask.CAUSAL  # one more: the oldest verdict goes
        assert known_masks.recognize(masks[0], True) is KnownMask.CAUSAL
        assert compared[0] == known_masks._MEMO_MASKS + 2


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
        verdicts: list[str] = []  # each mask the node was handed and its verdict (for the failure's message)
        real = _C.scaled_dot_product_attention
        real_recognize = known_masks.recognize

        def recorded(q_: Any, k_: Any, v_: Any, mask: Any, causal: bool, *rest: Any) -> Any:
            seen.append((mask is None, causal))
            return real(q_, k_, v_, mask, causal, *rest)

        def recognized(mask: torch.Tensor, keeps: bool) -> KnownMask:
            verdict = real_recognize(mask, keeps)
            verdicts.append(f"{mask.dtype} {tuple(mask.shape)} {torch.unique(mask.float()).tolist()}: {verdict}")
            return verdict

        monkeypatch.setattr(attention_node, "recognize", recognized)

        monkeypatch.setattr(attention_node, "_C", types.SimpleNamespace(scaled_dot_product_attention=recorded))
        with fast_calls.checked(fast_calls.GraphGuard([])):
            causal = gm(q, k, v)
        monkeypatch.setattr(known_masks, "_compare", lambda *args: KnownMask.OTHER)
        masked = gm(q, k, v)
        expected = model(q, k, v)
    assert seen == [(True, True), (False, False)], f"masks recognized: {verdicts}"
    torch.testing.assert_close(causal, masked, rtol=1e-6, atol=1e-6)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(causal.float(), expected.float(), rtol=tol, atol=tol)


def _vit_mask(n: int) -> torch.Tensor:
    """What an exported Hugging Face encoder with no padding builds: every query kept, broadcast by expand."""
    return (torch.arange(n) >= 0)[None, None, :, None].expand(2, 1, n, n)


KEEP_EVERYTHING = {
    "bool": lambda n: torch.ones(n, n, dtype=torch.bool),
    "bool expanded (ViT's)": _vit_mask,
    "one element": lambda n: torch.ones(1, 1, dtype=torch.bool),
    "fp32 zeros": lambda n: torch.zeros(2, 1, n, n),
    "bf16 zeros broadcast": lambda n: torch.zeros(1, 1, 1, n, dtype=torch.bfloat16).expand(2, 1, n, n),
    "fp32 negative zeros": lambda n: torch.full((n, n), -0.0),
}


@pytest.mark.parametrize("name", list(KEEP_EVERYTHING))
def test_a_mask_that_keeps_everything_is_recognized(name: str) -> None:
    assert known_masks.recognize(KEEP_EVERYTHING[name](6), bool_mask_keeps=True) is KnownMask.NOTHING


def _one_query_dropped(n: int) -> torch.Tensor:
    keep = torch.arange(n) >= 0
    keep[3] = False
    return keep[None, None, :, None].expand(2, 1, n, n)


def _one_key_masked(n: int) -> torch.Tensor:
    mask = torch.zeros(1, 1, 1, n)
    mask[..., n - 1] = float("-inf")
    return mask.expand(2, 1, n, n)


KEEP_NOT_EVERYTHING = {
    "a query masked in a broadcast mask": _one_query_dropped,
    "a padding key": _one_key_masked,
    "a tiny bias": lambda n: torch.zeros(n, n).index_fill_(1, torch.tensor([2]), 1e-30),
    "a NaN": lambda n: torch.zeros(n, n).index_fill_(0, torch.tensor([1]), float("nan")),
    "all False": lambda n: torch.zeros(n, n, dtype=torch.bool),
    "integer zeros": lambda n: torch.zeros(n, n, dtype=torch.int32),
}


@pytest.mark.parametrize("name", list(KEEP_NOT_EVERYTHING))
def test_a_mask_that_drops_a_score_is_kept(name: str) -> None:
    assert known_masks.recognize(KEEP_NOT_EVERYTHING[name](6), bool_mask_keeps=True) is KnownMask.OTHER


class EncoderAttention(nn.Module):
    """An encoder's attention with the mask an export of a Hugging Face encoder gives where nothing is padded."""

    def __init__(self, additive: bool) -> None:
        super().__init__()
        self.additive = additive

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        batch, _, length, _ = q.shape
        keep = (torch.arange(length) >= 0)[None, None, :, None].expand(batch, 1, length, length)
        if not self.additive:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        mask = torch.zeros(keep.shape, dtype=q.dtype).masked_fill(~keep, torch.finfo(q.dtype).min)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@needs_sdpa
@pytest.mark.parametrize("additive", [False, True], ids=["bool", "additive"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_kernel_runs_without_a_mask_that_keeps_everything(
    additive: bool, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 40, 16).to(dtype) for _ in range(3))
    model = EncoderAttention(additive).eval()
    with torch.no_grad():
        gm = all_passes(model, (q, k, v))
        seen: list[tuple[bool, bool]] = []
        verdicts: list[str] = []  # each mask the node was handed and its verdict (for the failure's message)
        real = _C.scaled_dot_product_attention
        real_recognize = known_masks.recognize

        def recorded(q_: Any, k_: Any, v_: Any, mask: Any, causal: bool, *rest: Any) -> Any:
            seen.append((mask is None, causal))
            return real(q_, k_, v_, mask, causal, *rest)

        def recognized(mask: torch.Tensor, keeps: bool) -> KnownMask:
            verdict = real_recognize(mask, keeps)
            verdicts.append(f"{mask.dtype} {tuple(mask.shape)} {torch.unique(mask.float()).tolist()}: {verdict}")
            return verdict

        monkeypatch.setattr(attention_node, "recognize", recognized)

        monkeypatch.setattr(attention_node, "_C", types.SimpleNamespace(scaled_dot_product_attention=recorded))
        unmasked = gm(q, k, v)
        monkeypatch.setattr(known_masks, "_compare", lambda *args: KnownMask.OTHER)
        masked = gm(q, k, v)
        expected = model(q, k, v)
    assert seen == [(True, False), (False, False)]
    torch.testing.assert_close(unmasked, masked, rtol=0, atol=0)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(unmasked.float(), expected.float(), rtol=tol, atol=tol)
