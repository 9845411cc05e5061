"""NMS: ember.nn.functional.nms beside torchvision.ops.nms (CPU), on detection-sized inputs.

Boxes come in clusters around object centres, as a detector's proposals do (several boxes per object, most
overlapping), with random scores; 1000 and 5000 boxes, IoU thresholds 0.5 and 0.7, float32. Both keep the same boxes
(checked here before timing). torchvision must import beside the running torch: on the development VM run this
under Debian's torch 1.13 (``/usr/bin/python3``, with python3-torchvision), on the Xeon under its torch 2.11.

    python benchmarks/bench_nms.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
from ember.nn.functional import nms

try:
    from torchvision.ops import nms as torchvision_nms
except Exception as error:
    sys.exit(f"bench_nms: torchvision does not import here ({error}); see the docstring")


def proposals(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    objects = max(n // 20, 1)
    centres = torch.rand(objects, 2, generator=gen) * 800
    xy = centres[torch.randint(0, objects, (n,), generator=gen)] + torch.randn(n, 2, generator=gen) * 8
    wh = torch.rand(n, 2, generator=gen) * 60 + 20
    return torch.cat([xy - wh / 2, xy + wh / 2], 1), torch.rand(n, generator=gen)


def main() -> None:
    bench = harness.Benchmark("nms", "NMS (float32), ember beside torchvision.ops.nms")
    gen = torch.Generator().manual_seed(0)
    for n in (1000, 5000):
        boxes, scores = proposals(n, gen)
        for threshold in (0.5, 0.7):
            kept = nms(boxes, scores, threshold)
            if not torch.equal(kept, torchvision_nms(boxes, scores, threshold)):
                sys.exit(f"bench_nms: ember and torchvision keep different boxes (n={n}, threshold={threshold})")
            timings = bench.interleaved({
                "torchvision": lambda b=boxes, s=scores, t=threshold: torchvision_nms(b, s, t),
                "ember": lambda b=boxes, s=scores, t=threshold: nms(b, s, t),
            }, min_time=2.0)  # fmt: skip
            for impl, t in timings.items():
                bench.add(boxes=n, iou_threshold=threshold, kept=kept.numel(), impl=impl, time=t,
                          baseline=timings["torchvision"])  # fmt: skip
    bench.note("speedup is over torchvision's CPU kernel, timed round-robin with it (harness.time_interleaved).")
    bench.write()


if __name__ == "__main__":
    main()
