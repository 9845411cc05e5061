"""Real architectures end to end: torch eager (with bf16 autocast for bf16, and beside it the fp32 model as it
is), ember's module rewrite (``ember.optimize``), ember's graph mode (``graph_mode=True``),
``torch.compile(backend="ember")`` and, with ``--inductor``, torch.compile's default backend; the time each takes
to optimize or compile beside the speed. max_rel_err of the fp32 model in a bf16 row is autocast's own error: the
scale against which ember's bf16 error is judged.

Models (random weights, built from their configs; no download): by default torchvision's ResNet-50,
MobileNetV3-Large, EfficientNet-B0, ConvNeXt-T and ViT-B/16 at 224x224; Hugging Face's BERT-base, GPT-2 and a
Llama-shaped decoder (8 layers of 1024, 16 heads) at sequence 128, with ``use_cache=False`` (the LLM path owns
generation). ``--models all`` adds the rest of the graph-mode issue's list: ResNeXt-50, MobileNetV2,
EfficientNetV2-S, RegNetY-400MF, DenseNet-121, Swin-T and Faster R-CNN's ResNet-50 + FPN backbone; RoBERTa,
DistilBERT, ALBERT, DeBERTa-v2, ELECTRA (base sizes), Qwen2 and Mistral (the Llama shape, grouped-query), T5-small,
BART-base, Hugging Face's ViT, DeiT and Swin, CLIP's text encoder, Wav2Vec2-base (1 s of audio) and Whisper (its
default config, 30 s of frames). Every candidate runs under torch.inference_mode() on the same inputs, timed
round-robin in one process; the GEMM ceiling of the same run is beside them. max_rel_err is each candidate's
largest difference from eager over eager's largest value.

    python benchmarks/bench_models.py [--models resnet50,bert,...|all] [--batches 1,16] [--dtypes bfloat16,float32]
                                      [--inductor] [--prepack] [--min-time 2] [--part NAME]

``--part`` names a run of a subset (results/models-NAME-<machine>.md), so that a long list can be measured in
several runs; ``benchmarks/plot_models.py`` draws every part of a machine together. ``--prepack`` adds graph mode with
``weights_prepack=True``: in fp32 the default reads each Linear's weight where it lies (no second copy), and this
row measures what a packed copy of every weight would buy for that memory.
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
DEFAULT = (*VISION, *TEXT)

# The rest of the graph-mode issue's list (``--models all``): torchvision's builders by name, and Hugging Face
# configs at their base sizes (the decoder-only ones at the Llama-shaped size above).
MORE_VISION = {
    "resnext50": "resnext50_32x4d",
    "mobilenet_v2": "mobilenet_v2",
    "efficientnet_v2_s": "efficientnet_v2_s",
    "regnet_y_400mf": "regnet_y_400mf",
    "densenet121": "densenet121",
    "swin_t": "swin_t",
}
MORE_TEXT = (
    "roberta", "distilbert", "albert", "deberta_v2", "electra", "qwen2", "mistral", "t5", "bart", "hf_vit", "deit",
    "hf_swin", "clip_text", "wav2vec2", "whisper",
)  # fmt: skip
ALL = (*DEFAULT, *MORE_VISION, "detection_backbone", *MORE_TEXT)

_DECODER = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8, "num_attention_heads": 16}
_BASE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}


def build(name: str) -> tuple[torch.nn.Module, Callable[[int], dict[str, Any]]]:
    """The model in eval mode and a function making its keyword inputs for a batch size."""
    torch.manual_seed(0)
    vision = {**VISION, **MORE_VISION}
    if name in vision or name == "detection_backbone":
        import torchvision

        if name == "detection_backbone":  # Faster R-CNN's ResNet-50 + FPN, as the detector calls it
            model = torchvision.models.detection.fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None).backbone
        else:
            model = getattr(torchvision.models, vision[name])()
        return model.eval(), lambda b: {"x": torch.randn(b, 3, 224, 224)}
    model, inputs = _hugging_face(name)
    return model.eval(), inputs


def _hugging_face(name: str) -> tuple[torch.nn.Module, Callable[[int], dict[str, Any]]]:
    import transformers as t

    def text(b: int, length: int = 128, **extra: Any) -> dict[str, Any]:
        ids = torch.randint(0, 1000, (b, length))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), **extra}

    no_cache = {"use_cache": False}
    decoders = {"llama": (t.LlamaConfig, t.LlamaModel, 16), "qwen2": (t.Qwen2Config, t.Qwen2Model, 4),
                "mistral": (t.MistralConfig, t.MistralModel, 4)}  # fmt: skip
    if name in decoders:  # (Qwen2 and Mistral are grouped-query models)
        config_class, model_class, heads_kv = decoders[name]
        config = config_class(**_DECODER, num_key_value_heads=heads_kv, vocab_size=32000)
        return model_class(config), lambda b: text(b, **no_cache)
    models: dict[str, Callable[[], tuple[torch.nn.Module, Callable[[int], dict[str, Any]]]]] = {
        "bert": lambda: (t.BertModel(t.BertConfig()), text),
        "gpt2": lambda: (t.GPT2Model(t.GPT2Config()), lambda b: text(b, **no_cache)),
        "roberta": lambda: (t.RobertaModel(t.RobertaConfig()), text),
        "distilbert": lambda: (t.DistilBertModel(t.DistilBertConfig()), text),
        "albert": lambda: (t.AlbertModel(t.AlbertConfig(embedding_size=128, **_BASE)), text),
        "deberta_v2": lambda: (t.DebertaV2Model(t.DebertaV2Config(**_BASE)), text),
        "electra": lambda: (t.ElectraModel(t.ElectraConfig(embedding_size=768, **_BASE)), text),
        "t5": lambda: (  # t5-small
            t.T5Model(t.T5Config()),
            lambda b: {**text(b), "decoder_input_ids": torch.randint(0, 1000, (b, 128)), **no_cache},
        ),
        "bart": lambda: (t.BartModel(_bart_base(t)), lambda b: text(b, **no_cache)),
        "hf_vit": lambda: (t.ViTModel(t.ViTConfig()), lambda b: {"pixel_values": torch.randn(b, 3, 224, 224)}),
        "deit": lambda: (t.DeiTModel(t.DeiTConfig()), lambda b: {"pixel_values": torch.randn(b, 3, 224, 224)}),
        "hf_swin": lambda: (t.SwinModel(t.SwinConfig()), lambda b: {"pixel_values": torch.randn(b, 3, 224, 224)}),
        "clip_text": lambda: (t.CLIPTextModel(t.CLIPTextConfig()), lambda b: text(b, 77)),  # (its positions: 77)
        "wav2vec2": lambda: (t.Wav2Vec2Model(t.Wav2Vec2Config()), lambda b: {"input_values": torch.randn(b, 16000)}),
        "whisper": lambda: (t.WhisperModel(t.WhisperConfig()), _whisper_inputs(t.WhisperConfig())),
    }
    if name not in models:
        raise ValueError(f"bench_models: unknown model {name!r}; known: {', '.join(ALL)}")
    return models[name]()


def _bart_base(t: Any) -> Any:
    heads, ffn = {"encoder_attention_heads": 12, "decoder_attention_heads": 12}, {"encoder_ffn_dim": 3072}
    return t.BartConfig(d_model=768, encoder_layers=6, decoder_layers=6, decoder_ffn_dim=3072, **heads, **ffn)


def _whisper_inputs(config: Any) -> Callable[[int], dict[str, Any]]:
    """30 s of log-mel frames and a few decoder tokens."""
    return lambda b: {
        "input_features": torch.randn(b, config.num_mel_bins, 3000),
        "decoder_input_ids": torch.full((b, 4), config.decoder_start_token_id),
        "use_cache": False,
    }


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
    parser.add_argument("--models", default=",".join(DEFAULT), help=f"comma-separated, or 'all': {', '.join(ALL)}")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--dtypes", default="bfloat16")
    parser.add_argument("--inductor", action="store_true", help="also torch.compile with its default backend")
    parser.add_argument("--min-time", type=float, default=1.5, help="seconds per candidate and case")
    parser.add_argument(
        "--prepack",
        action="store_true",
        help="also graph mode with weights_prepack=True (fp32: packed copies beside the weights read in place)",
    )
    parser.add_argument("--part", default="", help="a name for a run of a subset: results/models-<part>-<machine>.md")
    args = parser.parse_args()
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    title = "Real architectures: eager, ember's module rewrite, graph mode, torch.compile"
    bench = harness.Benchmark("models", title, part=args.part)
    bench.gemm_ceiling(dtypes=tuple(dtypes), min_time=0.5)
    for name in ALL if args.models == "all" else args.models.split(","):
        model, make_inputs = build(name)
        for dtype in dtypes:
            dtype_name = str(dtype).replace("torch.", "")
            sample = make_inputs(1)
            setup: dict[str, float] = {}
            candidates: dict[str, Callable[..., Any]] = {"torch eager": under(dtype, model)}
            if dtype != torch.float32:  # the fp32 model beside autocast: what a lower precision has to beat
                candidates["torch eager fp32"] = model
            optimized: dict[str, dict[str, Any]] = {
                "ember modules": {},
                "ember graph": {"graph_mode": True, "sample_input": sample},
            }
            if args.prepack:
                optimized["ember graph prepacked"] = {**optimized["ember graph"], "weights_prepack": True}
            for impl, options in optimized.items():
                t0 = time.perf_counter()
                candidates[impl] = ember.optimize(model, dtype=dtype, **options)
                setup[impl] = time.perf_counter() - t0
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
            bench.write()  # after each model: a run cut short keeps what it measured


if __name__ == "__main__":
    main()
