"""What an activation costs a oneDNN layer: ember's Linear and Conv2d with and without it, beside torch.

oneDNN computes no activation for ember but one (csrc/onednn/onednn_common.h, EpilogueSplit: its ReLU turns NaN
into 0): each activation is a pass of ember's epilogue over the layer's output after the primitive, in place, in the
output's dtype (a bf16 output's activation starts from the values the primitive rounded, as under autocast). The
exception is a bf16 output's leading GELU (erf or tanh), which runs inside the primitive where a bound shows every
sum finite (onednn::fuses_gelu): its row here is that fused GELU's cost. This measures where models spend it:
BERT-base's intermediate Linear (768 -> 3072, GELU; GPT-2's tanh GELU at that shape) at 128 and 32x128 rows,
Whisper's encoder FC1 (384 -> 1536 over 1500 frames), and ResNet-50's widest and narrowest 1x1 convolutions (ReLU)
at batch 1 and 32. Rows: the layer with no activation (the primitive alone), with the activation, torch's
``act(F.linear(...))`` / ``act(F.conv2d(...))``, and the difference of the first two ("the pass"), with its GB/s
counting the output read and written once each, beside the run's memory ceiling (a pass over an output still in the
caches can beat that ceiling, which is DRAM's).

    python benchmarks/bench_epilogue.py [--dtypes float32,bfloat16] [--batches 1,32]
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

TORCH_ACTS = {"relu": torch.relu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}
# (out_features, in_features, rows per batch item, activation): BERT-base's intermediate dense at 128 tokens (GPT-2's
# at the same shape, with its tanh GELU), Whisper's encoder FC1 over its 1500 frames.
LINEARS = [(3072, 768, 128, "gelu"), (3072, 768, 128, "gelu_tanh"), (3072, 768, 128, "relu"), (1536, 384, 1500, "gelu")]
# (in, out, input size, activation): ResNet-50's 1x1 convolutions with the largest and the smallest output.
CONVS = [(64, 256, 56, "relu"), (512, 2048, 7, "relu")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--min-time", type=float, default=0.5, help="seconds per candidate and case")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]

    bench = harness.Benchmark("epilogue", "Activations in ember's epilogue: the pass after a oneDNN layer")
    dtypes = [d for d in args.dtypes.split(",") if _C.Linear.supported(d) and _C.Convolution.supported(d)]
    if len(dtypes) < len(args.dtypes.split(",")):
        bench.note("oneDNN has no bf16 matmul or convolution on this CPU (it needs AVX-512): bf16 rows are left out.")
    bench.stream_ceiling()
    torch.manual_seed(0)

    def measure(case: dict, act: str, layer_call, torch_call, unactivated: torch.Tensor) -> None:
        """Checks ember's layer + act against the fp32 `unactivated` output, then times the three and the pass."""
        got = layer_call([act])
        ref = TORCH_ACTS[act](unactivated)
        err = float((got.float() - ref).abs().max() / ref.abs().max())
        assert err < (2e-2 if got.dtype == torch.bfloat16 else 1e-4), (case, act, err)
        out_bytes = got.numel() * got.element_size()
        timings = bench.interleaved(
            {
                "ember, no activation": lambda: layer_call([]),
                f"ember + {act}": lambda: layer_call([act]),
                f"torch {act}(layer)": torch_call,
            },
            min_time=3 * args.min_time,
        )
        for impl, t in timings.items():
            bench.add(**case, impl=impl, time=t, baseline=timings[f"torch {act}(layer)"])
        pass_s = timings[f"ember + {act}"].median - timings["ember, no activation"].median
        row = dict(case, impl="the pass (difference)", median_us=pass_s * 1e6)
        if pass_s > 0:
            row["GB_s"] = 2 * out_bytes / pass_s / 1e9
            row["pct_of_ceiling"] = 100 * row["GB_s"] / bench.stream_gbs
        bench.record(row)

    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        for n, k, rows, act in LINEARS:
            w32, b32 = torch.randn(n, k) / k**0.5, torch.randn(n)
            layer = _C.Linear(dlpack(w32), dlpack(b32), dtype_name, True, 64)
            w, b = w32.to(dtype), b32.to(dtype)
            for batch in batches:
                x = torch.randn(batch * rows, k).to(dtype)

                def linear(epilogue, x=x, layer=layer, n=n, dtype=dtype):
                    out = torch.empty(x.shape[0], n, dtype=dtype)
                    layer.forward(dlpack(x), None, dlpack(out), epilogue)
                    return out

                def torch_linear(x=x, w=w, b=b, act=act):
                    return TORCH_ACTS[act](F.linear(x, w, b))

                case = {"layer": f"Linear {k}->{n}", "rows": x.shape[0], "dtype": dtype_name}
                measure(case, act, linear, torch_linear, F.linear(x.float(), w32, b32))
        for cin, cout, size, act in CONVS:
            w32, b32 = torch.randn(cout, cin, 1, 1) / cin**0.5, torch.randn(cout)
            w = w32.to(dtype).contiguous(memory_format=torch.channels_last)
            b = b32.to(dtype)
            for batch in batches:
                x = torch.randn(batch, cin, size, size).to(dtype).contiguous(memory_format=torch.channels_last)
                layer = _C.Convolution(
                    dlpack(w32), dlpack(b32), [1, 1], [0, 0], [0, 0], [1, 1], 1, False, dtype_name, dlpack(x)
                )
                shape = layer.output_shape(list(x.shape))

                def conv(epilogue, x=x, layer=layer, shape=shape, dtype=dtype):
                    out = torch.empty(shape, dtype=dtype, memory_format=torch.channels_last)
                    layer.forward(dlpack(x), dlpack(out), epilogue)
                    return out

                def torch_conv(x=x, w=w, b=b, act=act):
                    return TORCH_ACTS[act](F.conv2d(x, w, b))

                case = {"layer": f"Conv2d 1x1 {cin}->{cout} @{size}", "rows": batch, "dtype": dtype_name}
                measure(case, act, conv, torch_conv, F.conv2d(x.float(), w32, b32))
    bench.write()


if __name__ == "__main__":
    main()
