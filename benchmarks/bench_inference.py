"""End-to-end inference: ember.optimize(model.eval()) beside torch eager and, with --compile, torch.compile.

Models: ResNet-50 (torchvision's where it imports, so ember's known-container fusion applies; else the torch.nn
copy in models.py) at 224x224, and BERT-base at sequence 128 (Hugging Face's BertModel with its default config
where transformers imports; else models.py's BERT-shaped nn.TransformerEncoder, which torch runs on its own fused
kernel). Batch 1 and 32, float32 and bfloat16. torch's bf16 baseline is eager under
``torch.autocast("cpu", dtype=torch.bfloat16)``, the way IPEX users ran it; ember's is ``ember.optimize(model,
dtype=torch.bfloat16)`` called with fp32 inputs; in fp32 also ``weights_prepack=True`` (packed copies of the
Linear weights, which otherwise run in place). Every candidate runs under torch.inference_mode(). GFLOP/s
counts the model's multiply-adds (2 per MAC); the ceilings are torch.mm's rate at 2048^3 in each dtype.

    python benchmarks/bench_inference.py [--models resnet50,bert] [--batches 1,32] [--dtypes float32,bfloat16]
                                         [--compile resnet50:bfloat16:1,...]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ember
import harness
import models

# Multiply-adds per sample (fvcore's count for ResNet-50 at 224; BERT-base at 128 tokens: 12 layers of
# 4·768² + 2·768·3072 per token plus attention's 2·128·768 per token).
MACS = {"resnet50": 4.09e9, "bert": 12 * 128 * (4 * 768**2 + 2 * 768 * 3072 + 2 * 128 * 768)}


def build(name: str) -> tuple[torch.nn.Module, callable, str]:
    """The model in eval mode, a function making its input for a batch size, and what it is."""
    torch.manual_seed(0)
    if name == "resnet50":
        try:
            import torchvision

            model, what = torchvision.models.resnet50(), "torchvision resnet50"
        except Exception:
            model, what = models.ResNet50(), "models.ResNet50 (torchvision does not import)"
        return model.eval(), lambda b: torch.randn(b, 3, 224, 224), what
    try:
        import transformers

        model = transformers.BertModel(transformers.BertConfig()).eval()
        return model, lambda b: torch.randint(0, 30522, (b, 128)), f"transformers {transformers.__version__} BertModel"
    except ImportError:
        return (
            models.BertShapedEncoder().eval(),
            lambda b: torch.randint(0, 30522, (b, 128)),
            "models.BertShapedEncoder",
        )


def eager(model: torch.nn.Module, dtype: torch.dtype):
    if dtype == torch.float32:
        return model

    def run(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(x)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet50,bert")
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--compile", default="", help="model:dtype:batch cases to also run under torch.compile")
    parser.add_argument("--min-time", type=float, default=2.0, help="seconds per candidate and case")
    args = parser.parse_args()
    compile_cases = {tuple(c.split(":")) for c in args.compile.split(",") if c}

    bench = harness.Benchmark("inference", "End to end: ember.optimize beside torch eager (and torch.compile)")
    peaks = bench.gemm_ceiling(dtypes=tuple(getattr(torch, d) for d in args.dtypes.split(",")))
    for name in args.models.split(","):
        model, make_input, what = build(name)
        bench.note(f"{name}: {what}")
        for dtype_name in args.dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            t0 = time.perf_counter()
            optimized = ember.optimize(model, dtype=dtype)
            bench.note(f"{name} {dtype_name}: ember.optimize took {time.perf_counter() - t0:.2f} s")
            # fp32 Linear weights run in place by default; weights_prepack=True trades a packed copy for speed (in
            # bf16 they are packed either way, as bf16 copies of the fp32 weights).
            packed = ember.optimize(model, dtype=dtype, weights_prepack=True) if dtype == torch.float32 else None
            for batch in (int(b) for b in args.batches.split(",")):
                x = make_input(batch)
                cases = {"torch eager": eager(model, dtype), "ember": optimized}
                if packed is not None:
                    cases["ember weights_prepack=True"] = packed
                if (name, dtype_name, str(batch)) in compile_cases:
                    compiled = torch.compile(eager(model, dtype))
                    t0 = time.perf_counter()
                    with torch.inference_mode():
                        compiled(x)
                    bench.note(
                        f"{name} {dtype_name} batch {batch}: torch.compile took {time.perf_counter() - t0:.0f} s"
                    )
                    cases["torch.compile"] = compiled
                with torch.inference_mode():
                    out = {k: fn(x) for k, fn in cases.items()}
                    ref = out["torch eager"]
                    ref = ref.last_hidden_state if hasattr(ref, "last_hidden_state") else ref
                    got = out["ember"]
                    got = got.last_hidden_state if hasattr(got, "last_hidden_state") else got
                    err = float((got.float() - ref.float()).abs().max() / ref.float().abs().max())
                    timed = {k: (lambda fn=fn, x=x: fn(x)) for k, fn in cases.items()}
                    timings = bench.interleaved(timed, min_time=args.min_time * len(cases))
                flops = 2 * MACS[name] * batch
                for impl, t in timings.items():
                    bench.add(
                        model=name,
                        dtype=dtype_name,
                        batch=batch,
                        impl=impl,
                        time=t,
                        baseline=timings["torch eager"],
                        GFLOP_s=flops / t.median / 1e9,
                        pct_of_peak=100 * flops / t.median / 1e9 / peaks[dtype_name],
                        max_rel_err=err if impl == "ember" else "",
                    )
    bench.write()


if __name__ == "__main__":
    main()
