"""RoIAlign: ember.nn.functional.roi_align beside torchvision.ops.roi_align (CPU), at detection sizes.

A Mask R-CNN box head's pooling: 1000 boxes over a 256-channel FPN level (1 x 256 x 200 x 272, stride 4:
spatial_scale 0.25), 7 x 7 bins, sampling_ratio 2, aligned; float32, row-major and channels-last features; forward,
and forward + backward with a given gradient. Both give the same values (checked before timing). torchvision must
import beside the running torch: on the development VM run this under Debian's torch 1.13 (``/usr/bin/python3``), on
the Xeon under its torch 2.11.

    python benchmarks/bench_roi_align.py [--boxes 1000] [--channels 256]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
from ember.nn.functional import roi_align

try:
    from torchvision.ops import roi_align as torchvision_roi_align
except Exception as error:
    sys.exit(f"bench_roi_align: torchvision does not import here ({error}); see the docstring")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--boxes", type=int, default=1000)
    parser.add_argument("--channels", type=int, default=256)
    parser.add_argument("--min-time", type=float, default=3.0)
    args = parser.parse_args()
    h, w, scale = 200, 272, 0.25
    bench = harness.Benchmark("roi_align", f"RoIAlign: {args.boxes} boxes, {args.channels} x {h} x {w}, 7 x 7")
    gen = torch.Generator().manual_seed(0)
    xy = torch.rand(args.boxes, 2, generator=gen) * torch.tensor([w, h]) / scale
    wh = torch.rand(args.boxes, 2, generator=gen) * 200 + 16
    rois = torch.cat([torch.zeros(args.boxes, 1), xy, xy + wh], dim=1)
    base = torch.randn(1, args.channels, h, w, generator=gen)
    grad = torch.randn(args.boxes, args.channels, 7, 7, generator=gen)
    for layout in ("row-major", "channels-last"):
        features = base if layout == "row-major" else base.to(memory_format=torch.channels_last)
        ours = roi_align(features, rois, 7, scale, 2, True)
        theirs = torchvision_roi_align(features, rois, 7, scale, 2, True)
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
        leaf = features.clone().requires_grad_()
        impls = {"torchvision": torchvision_roi_align, "ember": roi_align}
        for pass_name in ("forward", "forward + backward"):
            cases = {}
            for name, fn in impls.items():
                if pass_name == "forward":
                    cases[name] = lambda fn=fn, x=features: fn(x, rois, 7, scale, 2, True)
                else:
                    cases[name] = lambda fn=fn, x=leaf: torch.autograd.grad(fn(x, rois, 7, scale, 2, True), x, grad)
            timings = bench.interleaved(cases, min_time=args.min_time, rounds=4)
            for impl, t in timings.items():
                bench.add(layout=layout, pass_=pass_name, impl=impl, time=t, baseline=timings["torchvision"])
    bench.note("speedup is over torchvision's CPU kernel, timed round-robin with it (harness.time_interleaved).")
    bench.write()


if __name__ == "__main__":
    main()
