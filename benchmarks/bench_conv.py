"""Convolutions: ember's oneDNN layer (weights prepacked, BatchNorm folded, ReLU fused) beside torch's
``relu(F.conv2d(x, w))`` on the shapes of ResNet-50.

Both sides get channels-last activations (torch's fastest CPU layout, and the one ember propagates); torch's
weight is channels-last too, and bf16 in its bf16 rows (a model cast with ``.to(torch.bfloat16)``). Every call
allocates its output, as a model's does. GFLOP/s = 2·N·OC·IC/groups·kh·kw·OH·OW / time; the ceiling is torch.mm's
rate at 2048³.

    python benchmarks/bench_conv.py [--batches 1,32] [--dtypes float32,bfloat16]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
from ember import _C
from ember._tensor import dlpack

# (in, out, kernel, stride, input size): every distinct convolution of torchvision's ResNet-50 (v1.5) but a few
# repeats of the same shape at another stage.
SHAPES = [
    (3, 64, 7, 2, 224),  # stem
    (64, 64, 1, 1, 56),
    (64, 64, 3, 1, 56),
    (64, 256, 1, 1, 56),
    (256, 64, 1, 1, 56),
    (128, 128, 3, 2, 56),
    (256, 512, 1, 2, 56),  # downsample
    (512, 128, 1, 1, 28),
    (256, 256, 3, 1, 14),
    (1024, 256, 1, 1, 14),
    (512, 512, 3, 1, 7),
    (512, 2048, 1, 1, 7),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds per candidate and case")
    args = parser.parse_args()

    bench = harness.Benchmark("conv", "Conv2d + ReLU: ember (oneDNN, prepacked, channels-last) beside torch")
    dtypes = [d for d in args.dtypes.split(",") if _C.Convolution.supported(d)]
    if len(dtypes) < len(args.dtypes.split(",")):
        bench.note("oneDNN has no bf16 convolution on this CPU (it needs AVX-512): bf16 rows are left out.")
    peaks = bench.gemm_ceiling(dtypes=tuple(getattr(torch, d) for d in dtypes))
    for cin, cout, k, stride, size in SHAPES:
        torch.manual_seed(0)
        w32 = torch.randn(cout, cin, k, k) / (cin * k * k) ** 0.5
        b32 = torch.randn(cout)
        pad = k // 2
        for dtype_name in dtypes:
            dtype = getattr(torch, dtype_name)
            w = w32.to(dtype).contiguous(memory_format=torch.channels_last)
            b = b32.to(dtype)
            for batch in (int(v) for v in args.batches.split(",")):
                x = torch.randn(batch, cin, size, size).to(dtype).contiguous(memory_format=torch.channels_last)
                layer = _C.Convolution(
                    dlpack(w32),
                    dlpack(b32),
                    [stride] * 2,
                    [pad] * 2,
                    [pad] * 2,
                    [1, 1],
                    1,
                    False,
                    dtype_name,
                    dlpack(x),
                )
                shape = layer.output_shape(list(x.shape))

                def ember_conv(x=x, layer=layer, shape=shape, dtype=dtype):
                    out = torch.empty(shape, dtype=dtype, memory_format=torch.channels_last)
                    layer.forward(dlpack(x), dlpack(out), ["relu"])
                    return out

                def torch_conv(x=x, w=w, b=b, stride=stride, pad=pad):
                    return torch.relu_(F.conv2d(x, w, b, stride, pad))

                ref = torch.relu(F.conv2d(x.float(), w32, b32, stride, pad))
                err = float((ember_conv().float() - ref).abs().max() / ref.abs().max())
                assert err < (2e-2 if dtype == torch.bfloat16 else 1e-4), (cin, cout, k, batch, dtype_name, err)
                timings = bench.interleaved(
                    {"torch F.conv2d": torch_conv, "ember": ember_conv}, min_time=2 * args.min_time
                )
                flops = 2 * batch * cout * cin * k * k * shape[2] * shape[3]
                for impl, t in timings.items():
                    bench.add(
                        shape=f"{cin}->{cout} {k}x{k}/{stride} @{size}",
                        dtype=dtype_name,
                        batch=batch,
                        impl=impl,
                        time=t,
                        baseline=timings["torch F.conv2d"],
                        GFLOP_s=flops / t.median / 1e9,
                        pct_of_peak=100 * flops / t.median / 1e9 / peaks[dtype_name],
                        onednn=layer.implementation(dlpack(x)) if impl == "ember" else "",
                    )
    bench.write()


if __name__ == "__main__":
    main()
