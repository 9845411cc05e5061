"""``ember.optimize``: one call that prepares a model (and its optimizer) for fast training or inference on x86 CPUs.
This module holds the signature, its documentation and the dispatch; training is in training.py, inference in
inference/."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from ember import _C
from ember._optimize.graph.api import capture_graph, capture_parts, install_graph
from ember._optimize.inference.api import (
    InferenceFlags,
    finish_for_inference,
    prepare_for_inference,
    rewrite_modules,
)
from ember._optimize.inference.common import cpu_autocast_takes
from ember._optimize.report import OptimizeReport
from ember._optimize.training import LEVELS, TrainingFlags, optimize_for_training


def optimize(
    model: nn.Module,
    dtype: torch.dtype | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    level: str = "O1",
    inplace: bool = False,
    *,
    split_master_weight_for_bf16: bool = True,
    fuse_update_step: bool = True,
    channels_last: bool | None = None,
    replace_dropout: bool | None = None,
    conv_bn_folding: bool | None = None,
    linear_bn_folding: bool | None = None,
    weights_prepack: bool | None = None,
    replace_dropout_with_identity: bool | None = None,
    sample_input: Any = None,
    graph_mode: bool | None = None,
    report: bool = False,
) -> Any:
    """Prepares ``model`` for the CPU: for training (a model in train mode, with its optimizer) it returns
    ``(model, optimizer)``, or the model alone when no optimizer is given; for inference (a model in eval mode)
    it returns the rewritten model.

    **Inference** (``model.eval()``; see docs/decisions.md, "Inference"). At level ``"O1"``:

    - ``nn.Linear`` (and Hugging Face ``Conv1D``) layers run on oneDNN's matmul, primitives cached per input
      shape (``weights_prepack``). A weight already in the compute dtype is read where it is; a weight that must
      change to be used (fp32 weights of a bf16 computation, a folded BatchNorm) is computed once into the
      layout the primitive prefers.
    - Conv1d/2d/3d and ConvTranspose1d/2d/3d run on oneDNN convolutions with the weight reordered once; 2-D and
      3-D ones read and write channels-last activations (an input in torch's default layout is converted at the
      first convolution, and outputs stay channels-last, as in a torch model converted to channels-last).
    - In ``nn.Sequential`` (and subclasses keeping its forward, such as torchvision's Conv2dNormActivation), a
      Linear or convolution and the BatchNorm after it (``linear_bn_folding``, ``conv_bn_folding``), activations
      (ReLU, GELU, SiLU, Sigmoid, Tanh, Hardswish, Hardsigmoid, ReLU6) and eval-mode dropouts after it run as one
      call: the BatchNorm folded into the weights, the activations as post-ops.
    - Known containers get the same fusion, residual adds included: torchvision's ResNet, BasicBlock, Bottleneck
      and SqueezeExcitation; Hugging Face's BERT/RoBERTa intermediate (Linear + GELU) and output (Linear +
      residual add) blocks, ViT MLP (Linear + GELU), and ResNet convolution layers, shortcuts and residual layers
      (conv + BN + ReLU, the last with the shortcut's add).
    - Dropout modules return their input at once in eval mode (``replace_dropout_with_identity``).
    - ``dtype=torch.bfloat16``: the kernels compute in bf16 (from a bf16 copy of fp32 weights), the forward runs
      under ``torch.autocast("cpu", dtype=torch.bfloat16)`` (fp32 inputs work as they are, and so does an enclosing
      autocast block); ``dtype=None`` or ``torch.float32`` computes in fp32.
    - ``dtype=torch.float16``: the same in fp16, on oneDNN's native f16 kernels, on CPUs with AVX512-FP16 (AMX-FP16
      CPUs have it) and torch >= 2.1 (CPU autocast to float16); elsewhere a ValueError names the dtype to use.
      Norms, attention and the rotary embedding run as torch's operations in fp16 (ember's kernels for them take
      fp32 and bf16). Training in fp16 is not implemented (NotImplementedError): train in bf16.

    Memory: nothing is copied that can be used as it is. The returned model shares its parameters' memory with the
    original (``inplace=False`` copies the module tree and buffers only), Linear weights in the compute dtype run
    in place, and the copies ember does make are caches in the compute dtype: bf16 copies of fp32 weights (half
    their size), and the blocked weights of convolutions (oneDNN has no fast convolution on torch's weight layout)
    and of layers with a BatchNorm folded in (new numbers), made at their first call. ``weights_prepack=True``
    (given explicitly) trades memory for speed: every Linear weight gets a packed copy too, which runs fp32
    Linears 1.2-2.9x torch from a few rows where reading the weight in place runs 0.9-2.2x (BERT-base fp32
    end to end at batch 1: 1.07-1.17x packed, 0.92-0.97x in place on the Xeon).

    Parameters, buffers, ``state_dict()`` keys, shapes and dtypes, module classes and the module tree stay those
    of the original: the prepacked weights are a cache, rebuilt when a weight changes. The fast path runs in eval
    mode without autograd (``torch.no_grad()`` or ``torch.inference_mode()``, or nothing requiring grad); in train
    mode, or when autograd records, the original modules run and gradients are torch's. Level ``"O0"`` only sets
    the compute dtype (bf16: autocast). ``sample_input`` (a tensor, a tuple of positional inputs, or a dict of
    keyword inputs) is run once under ``torch.no_grad()`` to build the kernels before the first real call.

    **Graph mode** (inference; the default where ``sample_input`` is given, ``graph_mode=True`` without one): the
    forward is captured as an FX graph (``torch.fx`` symbolic tracing, else ``torch.export`` on
    torch >= 2.6 driven by ``sample_input``, with batch and sequence sizes left dynamic), checked against the model
    on ``sample_input``, and rewritten: every Linear, convolution and constant-weight matmul in any form (module,
    functional, ATen) runs on ember's kernels, BatchNorms are folded into the layer before them, and activations,
    constant multiply-adds and a residual add after a layer run in its epilogue. The graph becomes the model's
    forward in eval mode; in train mode, and for inputs it was not captured for, the module-level rewrite runs. The
    report says which capture path was taken, and why the others failed.

    **Training** (``model.train()``).

    At level ``"O1"`` (the default):

    - ``dtype=torch.bfloat16``: the weights of Linear, Conv, ConvTranspose, Embedding, MultiheadAttention (and
      EmbeddingBag, LSTM, GRU, RNN where the running torch trains them in bf16 on this CPU) become split-BF16
      master weights: each parameter's data becomes its bf16 top half, which the model computes with, and the
      optimizer keeps the int16 bottom half, so the fp32 value is exact and never stored twice (see
      ``ember/_optimize/bf16_modules.py`` for what stays float32 and why). The forward runs under
      ``torch.autocast("cpu", dtype=torch.bfloat16)``, so fp32 inputs work as they are and the ops ember does not
      own follow autocast's rules; a surrounding autocast block is fine too. The optimizer is replaced by ember's
      fused one of the same kind, which updates the master weights in fp32 and splits them again in one pass.
      ``model.state_dict()`` gives the exact fp32 weights under the original keys and ``load_state_dict`` takes
      plain fp32 checkpoints; ``optimizer.state_dict()`` is torch.optim's. Convolution weights become
      channels-last, the layout oneDNN trains convolutions fastest in (``channels_last=False`` keeps theirs).
      ``nn.Dropout`` modules become ``ember.nn.Dropout``, whose mask comes from a parallel counter-based generator
      seeded from torch's and is not stored for backward, and ``nn.MultiheadAttention`` modules with dropout
      become ``ember.nn.MultiheadAttention``, whose attention dropout uses it (``replace_dropout=False`` keeps
      torch's).
    - ``dtype=None`` or ``torch.float32``: only the optimizer is replaced by ember's fused one.

    The optimizer is converted in place of its class (torch.optim SGD, Adam, AdamW, Adagrad become ember.optim's;
    ember.optim optimizers stay), so its param groups, state, hooks, and LR schedulers or GradScalers already
    bound to it carry over. Level ``"O0"`` changes nothing but the compute dtype: with bf16, the forward runs
    under autocast and the parameters and optimizer stay as they are.

    Args:
        model: the model: in train mode to train it, in eval mode for inference.
        dtype: None, ``torch.float32``, ``torch.bfloat16`` or (inference) ``torch.float16``.
        optimizer: the model's optimizer; required for bf16 at level O1 (it holds the master weights' bottom halves).
        level: ``"O0"`` or ``"O1"``.
        inplace: change ``model`` and ``optimizer`` themselves. Otherwise they are copied first (for inference,
            the module tree and buffers: the copy's parameters share the original's memory, since the inference
            rewrite never writes them; for training, everything), and the weights that
            become split-BF16 are split straight from the originals, never copied in fp32 first.
        split_master_weight_for_bf16: keep bf16 master weights split (the only mode ember implements; False, an
            fp32 master copy, raises NotImplementedError).
        fuse_update_step: replace the optimizer by ember's fused one (False keeps it, with dtype None or float32).
        channels_last: give convolution weights (and so their activations) the channels-last layout, which
            oneDNN trains fastest in. None (the default): on for bf16 at level O1 from torch 2.0 (torch 1.13's
            GELU backward gave NaN after such convolutions), off otherwise.
        replace_dropout: run dropout (``nn.Dropout`` modules, ``nn.MultiheadAttention``'s attention dropout) on
            ember's kernel: same probabilities, other random masks, several times faster. None (the default): on
            for bf16 at level O1, off otherwise.
        conv_bn_folding, linear_bn_folding, weights_prepack, replace_dropout_with_identity: inference rewrites
            (above); None (the default) follows the level (on at O1, off at O0). ``weights_prepack=False`` leaves
            Linears and convolutions to torch; ``True`` also packs Linear weights that could be read in place.
        sample_input: inference only: inputs to build the kernels with, and to capture and check the graph with
            (above).
        graph_mode: inference only: capture the forward as a graph and rewrite it (above). None (the default):
            graph mode where ``sample_input`` is given (the capture is checked on it), the module-level rewrite
            otherwise; False: the module-level rewrite always.
        report: print what was converted, what was left alone and why.
    """
    if graph_mode is not None and not isinstance(graph_mode, bool):
        raise TypeError(f"ember.optimize: graph_mode must be None, True or False, got {graph_mode!r}")
    _warn_where_bf16_is_emulated(dtype)
    inference_flags = {
        "conv_bn_folding": conv_bn_folding,
        "linear_bn_folding": linear_bn_folding,
        "weights_prepack": weights_prepack,
        "replace_dropout_with_identity": replace_dropout_with_identity,
    }
    if isinstance(model, nn.Module) and not model.training:
        return _optimize_inference(
            model,
            dtype,
            optimizer,
            level,
            inplace,
            inference_flags,
            sample_input,
            graph_mode if graph_mode is not None else sample_input is not None,
            report,
            training_flags={"channels_last": channels_last, "replace_dropout": replace_dropout},
        )
    inference_only = {**inference_flags, "sample_input": sample_input, "graph_mode": graph_mode}
    if given := [name for name, value in inference_only.items() if value is not None]:
        raise ValueError(
            f"ember.optimize: {', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to inference (a model in "
            "eval mode); this model is in train mode"
        )
    flags = TrainingFlags(split_master_weight_for_bf16, fuse_update_step, channels_last, replace_dropout)
    if dtype == torch.float16:
        raise NotImplementedError(
            "ember.optimize: float16 training (which needs loss scaling) is not implemented; train with "
            "dtype=torch.bfloat16, which has float32's range, and use float16 for inference"
        )
    return optimize_for_training(model, _check_dtype(dtype) == torch.bfloat16, optimizer, level, inplace, flags, report)


def _optimize_inference(
    model: nn.Module,
    dtype: Any,
    optimizer: Any,
    level: Any,
    inplace: bool,
    flags: dict[str, bool | None],
    sample_input: Any,
    graph_mode: bool,
    report: bool,
    training_flags: dict[str, Any],
) -> nn.Module:
    compute = _check_dtype(dtype)
    if optimizer is not None:
        raise ValueError("ember.optimize: the model is in eval mode but an optimizer was given; call model.train()")
    if level not in LEVELS:
        raise ValueError(f"ember.optimize: level must be one of {', '.join(LEVELS)}, got {level!r}")
    if given := [name for name, value in training_flags.items() if value is not None]:
        raise ValueError(
            f"ember.optimize: {', '.join(given)} apply to training (a model in train mode); this model is in eval mode"
        )
    resolved = InferenceFlags.resolve(level, **flags)
    log = OptimizeReport()
    model = prepare_for_inference(model, inplace, compute, log)
    # Capture sees torch's forwards, before any of ember's is installed. The graph goes in after the module-level
    # rewrite, which stays beneath it for what the graph does not run (train mode, inputs it was not captured for).
    captured = capture_graph(model, sample_input, compute, log) if graph_mode and resolved.weights_prepack else None
    parts = capture_parts(model, sample_input, compute, log) if captured is not None and captured.graph is None else []
    rewrite_modules(model, compute, resolved, log)
    graph = install_graph(model, captured, compute, sample_input, log) if captured is not None else None
    for name, part, part_capture, part_input in parts:
        install_graph(part, part_capture, compute, part_input, log, name)
    warm_up = sample_input
    if graph is not None and sample_input is not None:
        # Its check ran the whole rewritten graph on sample_input: the kernels are built for those shapes.
        warm_up = None
        log.actions.append("the rewritten graph ran sample_input (kernels built and primitives cached for its shapes)")
    model = finish_for_inference(model, compute, resolved, warm_up, log)
    if report:
        print(log)
    return model


# Measured on a 2-core AVX2 EPYC (docs/guides/troubleshooting.md): a small CNN at batch 8 181 ms in fp32 against
# 5980 ms in bf16, a stack of BERT-sized MLPs at 128 rows 121 against 592 ms; bf16 training 9-19x slower than fp32.
_EMULATED_BF16 = (
    "ember.optimize: this CPU ({cpu}) has no bfloat16 arithmetic (AVX512-BF16 or AMX): torch and oneDNN emulate "
    "bfloat16 there, 5-30x slower than float32; dtype=torch.float32 is the fast choice on it"
)


def has_bf16_arithmetic() -> bool:
    """Whether this CPU computes in bfloat16 (AVX512-BF16 or AMX-BF16): where oneDNN has bf16 matmuls for ember's
    layers. Elsewhere (AVX2-only Xeons and EPYCs before Zen 4) bfloat16 is emulated, by torch's kernels as by oneDNN's,
    and ember.optimize warns that it is the slow choice."""
    return bool(_C.Linear.supported("bfloat16"))


def _warn_where_bf16_is_emulated(dtype: Any) -> None:
    """The warning of :func:`has_bf16_arithmetic`, at the line that called ember.optimize."""
    if dtype == torch.bfloat16 and not has_bf16_arithmetic():
        warnings.warn(_EMULATED_BF16.format(cpu=_C.cpu_features()["brand"].strip()), UserWarning, stacklevel=3)


def _check_dtype(dtype: Any) -> torch.dtype:
    """The compute dtype ``dtype`` asks for, where this CPU and this torch run it."""
    if dtype is None or dtype == torch.float32:
        return torch.float32
    if dtype == torch.bfloat16:
        return torch.bfloat16
    if dtype == torch.float16:
        _check_float16()
        return torch.float16
    raise ValueError(
        f"ember.optimize: dtype must be None, torch.float32, torch.bfloat16 or torch.float16, got {dtype!r}"
    )


def _check_float16() -> None:
    """float16 runs on oneDNN's native f16 kernels (AVX512-FP16, which AMX-FP16 CPUs have too) under torch's CPU
    autocast to float16 (torch >= 2.1); anywhere else, a ValueError naming the dtype to use instead."""
    if not _C.Linear.supported("float16"):
        instead = "torch.bfloat16 (this CPU has it)" if has_bf16_arithmetic() else "torch.float32"
        raise ValueError(
            "ember.optimize: dtype=torch.float16 needs a CPU with AVX512-FP16 or AMX-FP16 (oneDNN's float16 kernels "
            f"elsewhere run at a fraction of float32's speed), which this CPU ({_C.cpu_features()['brand'].strip()}) "
            f"lacks; use dtype={instead}"
        )
    if not cpu_autocast_takes(torch.float16):
        raise ValueError(
            "ember.optimize: dtype=torch.float16 needs torch's CPU autocast to float16, which torch "
            f"{torch.__version__} lacks (torch >= 2.1 has it); use dtype=torch.bfloat16"
        )
