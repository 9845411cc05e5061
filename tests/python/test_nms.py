"""ember.nn.functional.nms against torchvision's (where it imports) and a transcription of its CPU kernel in
Python, on every ISA path; dtypes, ties, the operator under torch.fx/compile, and bad input."""

from __future__ import annotations

import pytest
import torch

import ember
from ember.nn.functional import nms

try:
    from torchvision.ops import nms as torchvision_nms
except Exception:
    torchvision_nms = None


def reference_nms(boxes: torch.Tensor, scores: torch.Tensor, threshold: float) -> torch.Tensor:
    """torchvision's CPU kernel, pair by pair, in the boxes' dtype (a stable descending sort for ties)."""
    order = torch.sort(scores, descending=True, stable=True).indices.tolist()
    x1, y1, x2, y2 = boxes.unbind(1)
    areas = (x2 - x1) * (y2 - y1)
    suppressed = [False] * len(order)
    keep = []
    for a, i in enumerate(order):
        if suppressed[i]:
            continue
        keep.append(i)
        for j in order[a + 1 :]:
            if suppressed[j]:
                continue
            w = torch.clamp(torch.minimum(x2[i], x2[j]) - torch.maximum(x1[i], x1[j]), min=0)
            h = torch.clamp(torch.minimum(y2[i], y2[j]) - torch.maximum(y1[i], y1[j]), min=0)
            inter = w * h
            if float(inter / (areas[i] + areas[j] - inter)) > threshold:
                suppressed[j] = True
    return torch.tensor(keep, dtype=torch.int64)


def random_boxes(n: int, gen: torch.Generator, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    centres = torch.rand(max(n // 8, 1), 2, generator=gen) * 300
    xy = centres[torch.randint(0, centres.shape[0], (n,), generator=gen)] + torch.randn(n, 2, generator=gen) * 6
    wh = torch.rand(n, 2, generator=gen) * 40 + 4
    return torch.cat([xy, xy + wh], 1).to(dtype), torch.rand(n, generator=gen).to(dtype)


@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.7])
def test_keeps_what_torchvisions_kernel_keeps(isa_level, threshold, gen):
    boxes, scores = random_boxes(150, gen)
    got = nms(boxes, scores, threshold)
    assert got.dtype == torch.int64
    assert torch.equal(got, reference_nms(boxes, scores, threshold))
    if torchvision_nms is not None:
        assert torch.equal(got, torchvision_nms(boxes, scores, threshold))


@pytest.mark.skipif(torchvision_nms is None, reason="torchvision does not import here")
def test_detection_sized_input_matches_torchvision(gen):
    boxes, scores = random_boxes(1000, gen)
    for threshold in (0.5, 0.7):
        assert torch.equal(nms(boxes, scores, threshold), torchvision_nms(boxes, scores, threshold))


def test_float64_and_half_precision(gen):
    boxes, scores = random_boxes(60, gen, torch.float64)
    assert torch.equal(nms(boxes, scores, 0.5), reference_nms(boxes, scores, 0.5))
    half_boxes, half_scores = boxes.to(torch.bfloat16), scores.to(torch.bfloat16)
    widened = nms(half_boxes, half_scores, 0.5)
    assert torch.equal(widened, nms(half_boxes.float(), half_scores.float(), 0.5))


def test_empty_ties_and_thresholds():
    assert nms(torch.empty(0, 4), torch.empty(0), 0.5).tolist() == []
    same = torch.tensor([[0.0, 0, 10, 10], [0, 0, 10, 10], [20, 20, 30, 30]])
    tied = torch.tensor([0.5, 0.5, 0.5])
    assert nms(same, tied, 0.5).tolist() == [0, 2]  # equal scores: the lower index first
    assert nms(same, torch.tensor([0.1, 0.9, 0.5]), 1.0).tolist() == [1, 2, 0]  # IoU 1 is not > 1


def test_one_operator_under_fx():
    class Post(torch.nn.Module):
        def forward(self, boxes, scores):
            return nms(boxes, scores, 0.5)

    traced = torch.fx.symbolic_trace(Post())
    assert torch.ops.ember.nms in [n.target for n in traced.graph.nodes if n.op == "call_function"]


def test_bad_input_raises_a_clear_error():
    with pytest.raises(ValueError, match=r"boxes must be \[N, 4\]"):
        nms(torch.ones(3, 5), torch.ones(3), 0.5)
    with pytest.raises(ValueError, match=r"scores must be \[3\]"):
        nms(torch.ones(3, 4), torch.ones(2), 0.5)
    with pytest.raises(TypeError, match="one dtype"):
        nms(torch.ones(3, 4), torch.ones(3, dtype=torch.float64), 0.5)
    with pytest.raises(TypeError, match="floating point"):
        nms(torch.ones(3, 4, dtype=torch.int64), torch.ones(3, dtype=torch.int64), 0.5)
    with pytest.raises(TypeError, match=r"boxes must be a torch\.Tensor"):
        nms([[0, 0, 1, 1]], torch.ones(1), 0.5)


def test_the_kernel_runs_at_the_expected_level(isa_level):
    level = ember._C.nms_implementation()
    assert level == ("ref" if isa_level == "ref" else "avx2" if isa_level == "avx2" else "avx512")
