"""ember beside its predecessor's best inference path, in one process: Intel's extension for PyTorch (IPEX, archived;
``ipex.optimize`` + ``torch.jit.trace`` + ``torch.jit.freeze``, the path its documentation recommends for
inference) against ``ember.optimize(graph_mode=True)`` and torch eager, on torchvision's ResNet-50 (224x224) and
Hugging Face's BERT-base (sequence 128), fp32 and bf16, batch 1 and 16.

IPEX pins one torch (2.8 for IPEX 2.8), so this runs in a virtual environment of its own, into which ember's one
wheel installs as it is (ember's binary does not link torch). IPEX 2.8 imports with transformers 4.x only (under 5.x
its import fails on a name transformers removed)::

    python3 -m venv ipex-venv
    ipex-venv/bin/pip install torch==2.8.0 intel-extension-for-pytorch==2.8.0 torchvision==0.23.0 transformers==4.51.3
    ipex-venv/bin/pip install --no-deps dist/ember-*.whl
    ipex-venv/bin/python benchmarks/bench_vs_ipex.py [--models resnet50,bert] [--dtypes float32,bfloat16] [--part NAME]

Without IPEX it says so and exits 0. Each case's candidates are timed round-robin (harness.time_interleaved);
``speedup`` is over torch eager (under bf16 autocast for bf16), ``vs_ipex`` over IPEX's path, ``max_rel_err`` the
largest difference from eager's output over its largest magnitude. bf16 is IPEX's ``ipex.optimize(dtype=bf16)``
traced and run under ``torch.autocast("cpu", bfloat16)``, as its documentation does it.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ember
import harness

MODELS = ("resnet50", "bert")


def build(name: str) -> tuple[torch.nn.Module, Callable[[int], tuple[torch.Tensor, ...]]]:
    """The model in eval mode (random weights, seed 0) and a function making its positional inputs for a batch."""
    torch.manual_seed(0)
    if name == "resnet50":
        import torchvision

        return torchvision.models.resnet50().eval(), lambda b: (torch.randn(b, 3, 224, 224),)
    import transformers

    # torchscript=True: tuples out, which torch.jit.trace (IPEX's path) needs; the same model for every candidate.
    model = transformers.BertModel(transformers.BertConfig(torchscript=True)).eval()

    def inputs(b: int) -> tuple[torch.Tensor, ...]:
        ids = torch.randint(0, 1000, (b, 128))
        return ids, torch.ones_like(ids)

    return model, inputs


def autocast(dtype: torch.dtype, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run under a CPU autocast to ``dtype`` when it is bf16."""
    if dtype != torch.bfloat16:
        return fn

    def run(*args: Any) -> Any:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return fn(*args)

    return run


def ipex_path(ipex: Any, model: torch.nn.Module, dtype: torch.dtype, sample: tuple[torch.Tensor, ...]) -> Any:
    """IPEX's recommended inference path: optimize, trace under the autocast it runs under, freeze."""
    optimized = ipex.optimize(model, dtype=dtype, inplace=False)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        traced = torch.jit.trace(optimized, sample, strict=False, check_trace=False)
        frozen = torch.jit.freeze(traced)
        for _ in range(2):  # the profiling executor specializes on the first calls
            frozen(*sample)
    return frozen


def first(value: Any) -> torch.Tensor:
    while isinstance(value, (tuple, list)):
        value = value[0]
    return value  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--min-time", type=float, default=2.0, help="seconds per candidate and case")
    parser.add_argument("--part", default="", help="names a run of a subset (results/vs_ipex-PART-<machine>.md)")
    args = parser.parse_args()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import intel_extension_for_pytorch as ipex
    except ImportError:
        print(
            "bench_vs_ipex: intel_extension_for_pytorch is not installed here; nothing to compare (see the docstring)"
        )
        return
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    bench = harness.Benchmark("vs_ipex", "ember beside IPEX's traced-and-frozen inference path", part=args.part)
    bench.gemm_ceiling(dtypes=tuple(dtypes), min_time=0.5)
    bench.note(f"IPEX {ipex.__version__}; ember's graph mode captured each model as its report says below.")
    for name in args.models.split(","):
        model, make_inputs = build(name)
        for dtype in dtypes:
            dtype_name = str(dtype).replace("torch.", "")
            for batch in (int(b) for b in args.batches.split(",")):
                inputs = make_inputs(batch)
                setup: dict[str, float] = {}
                t0 = time.perf_counter()
                ipex_model = ipex_path(ipex, model, dtype, inputs)
                setup["ipex optimize + trace + freeze"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                ember_model = ember.optimize(model, dtype=dtype, graph_mode=True, sample_input=inputs)
                setup["ember graph"] = time.perf_counter() - t0
                eager, ipex_run = autocast(dtype, model), autocast(dtype, ipex_model)
                candidates: dict[str, Callable[[], Any]] = {
                    "torch eager": lambda f=eager, i=inputs: f(*i),
                    "ipex optimize + trace + freeze": lambda f=ipex_run, i=inputs: f(*i),
                    "ember graph": lambda f=ember_model, i=inputs: f(*i),
                }
                with torch.inference_mode():
                    outs = {impl: first(fn()).float() for impl, fn in candidates.items()}
                    timings = bench.interleaved(candidates, min_time=args.min_time * len(candidates))
                reference = outs["torch eager"]
                scale = float(reference.abs().max()) or 1.0
                for impl, t in timings.items():
                    bench.add(
                        model=name, dtype=dtype_name, batch=batch, impl=impl, time=t, baseline=timings["torch eager"],
                        after={
                            "vs_ipex": timings["ipex optimize + trace + freeze"].median / t.median,
                            "max_rel_err": float((outs[impl] - reference).abs().max()) / scale,
                            "setup_s": setup.get(impl, ""),
                        },
                    )  # fmt: skip
    bench.write()


if __name__ == "__main__":
    main()
