"""Real architectures end to end: torch eager (with bf16 autocast for bf16), ember's module rewrite
(``ember.optimize``), ember's graph mode (``graph_mode=True``), ``torch.compile(backend="ember")`` and, with
``--inductor``, torch.compile's default backend; the time each takes to optimize or compile beside the speed.

Models (random weights, built from their configs; no download): torchvision's ResNet-50, MobileNetV3-Large,
EfficientNet-B0, ConvNeXt-T and ViT-B/16 at 224x224; Hugging Face's BERT-base, GPT-2 and a Llama-shaped decoder
(8 layers of 1024, 16 heads) at sequence 128, with ``use_cache=False`` (the LLM path owns generation). Every
candidate runs under torch.inference_mode() on the same inputs, timed round-robin in one process; the GEMM ceiling
of the same run is beside them. max_rel_err is each candidate's largest difference from eager over eager's largest
value.

    python benchmarks/bench_models.py [--models resnet50,bert,...] [--batches 1,16] [--dtypes bfloat16,float32]
                                      [--inductor] [--min-time 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ember
import harness

VISION = {
    "resnet50": "resnet50",
    "mobilenet_v3": "mobilenet_v3_large",
    "efficientnet_b0": "efficientnet_b0",
    "convnext_t": "convnext_tiny",
    "vit_b16": "vit_b_16",
}
TEXT = ("bert", "gpt2", "llama")


def build(name: str) -> tuple[torch.nn.Module, Callable[[int], dict[str, Any]]]:
    """The model in eval mode and a function making its keyword inputs for a batch size."""
    torch.manual_seed(0)
    if name in VISION:
        import torchvision

        model = getattr(torchvision.models, VISION[name])()
        return model.eval(), lambda b: {"x": torch.randn(b, 3, 224, 224)}
    import transformers

    if name == "bert":
        model = transformers.BertModel(transformers.BertConfig())
        options: dict[str, Any] = {}
    elif name == "gpt2":
        model = transformers.GPT2Model(transformers.GPT2Config())
        options = {"use_cache": False}
    else:
        config = transformers.LlamaConfig(
            hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
            num_key_value_heads=16, vocab_size=32000,
        )  # fmt: skip
        model = transformers.LlamaModel(config)
        options = {"use_cache": False}

    def inputs(b: int) -> dict[str, Any]:
        ids = torch.randint(0, 1000, (b, 128))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), **options}

    return model.eval(), inputs


def call(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    return fn(kwargs["x"]) if set(kwargs) == {"x"} else fn(**kwargs)


def first_tensor(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if hasattr(value, "to_tuple"):
        value = value.to_tuple()
    if isinstance(value, dict):
        value = list(value.values())
    return first_tensor(value[0])


def under(dtype: torch.dtype, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as torch's bf16 baseline runs it: under autocast (fp32: as it is)."""
    if dtype == torch.float32:
        return fn

    def run(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return fn(*args, **kwargs)

    return run


def ember_graph_path(model: Any) -> str:
    """Which capture path graph mode took for ``model``, as its installed forward says."""
    forward = model.__dict__.get("forward")
    forward = getattr(forward, "inner", forward)  # under the bf16 autocast forward
    return getattr(forward, "path", "not captured: the module rewrite runs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join([*VISION, *TEXT]))
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--dtypes", default="bfloat16")
    parser.add_argument("--inductor", action="store_true", help="also torch.compile with its default backend")
    parser.add_argument("--min-time", type=float, default=1.5, help="seconds per candidate and case")
    args = parser.parse_args()
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    bench = harness.Benchmark("models", "Real architectures: eager, ember's module rewrite, graph mode, torch.compile")
    bench.gemm_ceiling(dtypes=tuple(dtypes), min_time=0.5)
    for name in args.models.split(","):
        model, make_inputs = build(name)
        for dtype in dtypes:
            dtype_name = str(dtype).replace("torch.", "")
            sample = make_inputs(1)
            setup: dict[str, float] = {}
            candidates: dict[str, Callable[..., Any]] = {"torch eager": under(dtype, model)}
            t0 = time.perf_counter()
            candidates["ember modules"] = ember.optimize(model, dtype=dtype)
            setup["ember modules"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            candidates["ember graph"] = ember.optimize(model, dtype=dtype, graph_mode=True, sample_input=sample)
            setup["ember graph"] = time.perf_counter() - t0
            torch._dynamo.reset()
            # The backend's layers compute in what autocast says, as eager's do: bf16 is the compiled model under it.
            candidates["compile ember"] = under(dtype, torch.compile(model, backend="ember"))
            if args.inductor:
                candidates["compile inductor"] = torch.compile(under(dtype, model))
            for batch in (int(b) for b in args.batches.split(",")):
                inputs = make_inputs(batch)
                with torch.inference_mode():
                    outs = {}
                    for impl, fn in candidates.items():
                        t0 = time.perf_counter()
                        outs[impl] = first_tensor(call(fn, inputs)).float()
                        if impl.startswith("compile"):  # the first call at a new batch size compiles
                            setup[f"{impl} batch {batch}"] = time.perf_counter() - t0
                    reference = outs["torch eager"]
                    scale = float(reference.abs().max()) or 1.0  # (a zero-initialized head: ViT's)
                    timed = {impl: (lambda fn=fn, inputs=inputs: call(fn, inputs)) for impl, fn in candidates.items()}
                    timings = bench.interleaved(timed, min_time=args.min_time * len(timed))
                for impl, t in timings.items():
                    setup_s = setup.get(impl, setup.get(f"{impl} batch {batch}", ""))
                    bench.add(
                        model=name, dtype=dtype_name, batch=batch, impl=impl, time=t, baseline=timings["torch eager"],
                        max_rel_err=float((outs[impl] - reference).abs().max()) / scale,
                        after={"setup_s": setup_s},
                    )  # fmt: skip
            bench.note(f"{name} {dtype_name}: graph mode: {ember_graph_path(candidates['ember graph'])}")
    bench.write()


if __name__ == "__main__":
    main()
