"""``ember.llm.optimize``: a Hugging Face causal LM (or a plain-torch decoder) set up to generate on ember's
kernels, as the same model object.

What it changes, and what it keeps: the model's parameters are cast to ``dtype`` (as ``model.to(dtype)`` would:
generation reads each weight once a token, and a second, converted copy would double the memory), its ``forward``
becomes ember's decoder (decoder.py) on the instance, and its ``generate`` hands each generation an ember
:class:`~ember.llm.KVCache`. Its modules, classes and ``state_dict`` stay Hugging Face's: a checkpoint saved after
``optimize`` loads into the stock model. Calls ember's forward does not serve (gradients, a loss from ``labels``,
attention weights, a cache of Hugging Face's own) run the model's own forward.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch
from torch import nn

from ember import _C
from ember.llm.cache import KVCacheBase, new_cache
from ember.llm.decoder import Decoder, check
from ember.llm.families import family_of

_DTYPES = {torch.bfloat16: "bfloat16", torch.float32: "float32"}

# Tokens a cache block holds: a sequence wastes at most a block's tail (at 64 tokens, 3% of a 2048-token sequence),
# and the decode attention reads a block's keys as one run.
BLOCK_TOKENS = 64


def optimize(
    model: nn.Module,
    dtype: torch.dtype = torch.bfloat16,
    max_batch_size: int | None = None,
    max_seq_len: int | None = None,
) -> nn.Module:
    """Sets ``model`` (a Hugging Face ``...ForCausalLM``) up to generate on ember's kernels and returns it.

    ``dtype``: torch.bfloat16 or torch.float32, the dtype the model computes and caches keys and values in.
    ``max_batch_size`` and ``max_seq_len``: when both are given, the cache's memory for that many sequences of that
    many tokens is allocated (and faulted in) now, not during the first generation.

    A model whose family ember does not know is returned as it is, with a warning that says so."""
    if dtype not in _DTYPES:
        raise TypeError(f"ember.llm.optimize: dtype must be torch.bfloat16 or torch.float32, got {dtype}")
    for name, value in (("max_batch_size", max_batch_size), ("max_seq_len", max_seq_len)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"ember.llm.optimize: {name} must be a positive int or None, got {value!r}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"ember.llm.optimize: model must be a torch.nn.Module, got {type(model).__name__}")
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    try:
        family = family_of(model_type, config) if isinstance(model_type, str) else None
    except NotImplementedError as e:
        warnings.warn(f"ember.llm.optimize: {e}; the model runs unchanged", stacklevel=2)
        return model
    if family is None:
        what = f"model type {model_type!r}" if model_type else f"{type(model).__name__} (no Hugging Face config)"
        warnings.warn(f"ember.llm.optimize: {what} is not a family ember knows; the model runs unchanged",
                      stacklevel=2)  # fmt: skip
        return model
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise ValueError("ember.llm.optimize: the model's parameters must be on the CPU")
    try:
        check(model, family)  # what the table cannot say, found before anything changes
    except NotImplementedError as e:
        warnings.warn(f"ember.llm.optimize: {e}; the model runs unchanged", stacklevel=2)
        return model
    model.to(dtype)
    model.eval()
    decoder = Decoder(model, family, dtype)
    shape = decoder.shape
    pool = _C.KVCachePool(decoder.layer_count, shape.kv_heads, shape.head_dim, shape.head_dim, BLOCK_TOKENS,
                          _DTYPES[dtype])  # fmt: skip
    if max_batch_size is not None and max_seq_len is not None:
        pool.reserve(max_batch_size * -(-max_seq_len // BLOCK_TOKENS))
    forward = CausalLMForward(model, decoder, pool)
    model.forward = forward
    if hasattr(model, "generate"):
        model.generate = _with_ember_cache(model.generate, pool)
    model._ember_llm = forward  # type: ignore[assignment]
    return model


def _with_ember_cache(generate: Any, pool: _C.KVCachePool) -> Any:
    """``generate`` that hands each call a fresh ember KVCache, unless the call brings its own cache, asks for none,
    names a cache implementation of Hugging Face's, or wants attention weights or hidden states per step (those run
    the model's own forward)."""

    @functools.wraps(generate)
    def generate_with_ember_cache(*args: Any, **kwargs: Any) -> Any:
        config = kwargs.get("generation_config")
        wants = [kwargs.get(k, getattr(config, k, None)) for k in ("output_attentions", "output_hidden_states")]
        if (
            kwargs.get("past_key_values") is None
            and kwargs.get("use_cache", getattr(config, "use_cache", True)) is not False
            and kwargs.get("cache_implementation", getattr(config, "cache_implementation", None)) is None
            and not any(wants)
        ):
            kwargs["past_key_values"] = new_cache(pool)
        return generate(*args, **kwargs)

    return generate_with_ember_cache


class CausalLMForward:
    """The forward of an optimized causal LM, installed on the instance (``model.forward``)."""

    def __init__(self, model: nn.Module, decoder: Decoder, pool: _C.KVCachePool) -> None:
        self.model = model
        self.decoder = decoder
        self.pool = pool
        # (generate reads the forward's parameters off inspect.signature(model.forward): this __call__'s, without self)
        self.original = type(model).forward.__get__(model)

    def new_cache(self) -> KVCacheBase:
        return new_cache(self.pool)

    def __call__(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Any,
    ) -> Any:
        output_attentions = kwargs.pop("output_attentions", None)
        output_hidden_states = kwargs.pop("output_hidden_states", None)
        return_dict = kwargs.pop("return_dict", None)
        kwargs.pop("cache_position", None)  # (transformers 4.x passes it; positions follow from the cache here)
        num_logits_to_keep = kwargs.pop("num_logits_to_keep", None)
        if num_logits_to_keep is not None and not logits_to_keep:
            logits_to_keep = num_logits_to_keep
        ours = isinstance(past_key_values, KVCacheBase)
        if ours and past_key_values.pool is not self.pool:
            raise ValueError("ember.llm: this KVCache belongs to another model")
        runs_here = (
            (past_key_values is None or ours)
            and labels is None
            and not output_attentions
            and not kwargs
            and not (torch.is_grad_enabled() and self.model.training)
        )
        if not runs_here:
            if ours:
                raise NotImplementedError(
                    "ember.llm: this call needs the model's own forward (labels, attention weights, training or "
                    f"arguments {sorted(kwargs)}), which cannot read ember's KVCache; pass a DynamicCache instead"
                )
            return self.original(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                 past_key_values=past_key_values, inputs_embeds=inputs_embeds, labels=labels,
                                 use_cache=use_cache, logits_to_keep=logits_to_keep,
                                 output_attentions=output_attentions, output_hidden_states=output_hidden_states,
                                 return_dict=return_dict, **kwargs)  # fmt: skip
        if use_cache is None:
            use_cache = bool(getattr(self.model.config, "use_cache", True))
        cache = past_key_values if ours else (self.new_cache() if use_cache else None)
        hidden: list[torch.Tensor] | None = [] if output_hidden_states else None
        with torch.no_grad():
            logits = self.decoder.forward(input_ids, inputs_embeds, attention_mask, position_ids, cache,
                                          logits_to_keep, hidden)  # fmt: skip
        if not callable(getattr(self.model, "generate", None)):  # a plain-torch decoder: plain results
            return (logits, cache if use_cache else None)
        return _causal_lm_output(logits, cache if use_cache else None, hidden, return_dict)

    def __repr__(self) -> str:
        return (
            f"ember.llm forward ({self.decoder.family.name}, {self.decoder.layer_count} layers, {self.decoder.dtype})"
        )


def _causal_lm_output(
    logits: torch.Tensor, cache: KVCacheBase | None, hidden: list[torch.Tensor] | None, return_dict: bool | None
) -> Any:
    try:
        from transformers.modeling_outputs import CausalLMOutputWithPast
    except ImportError:
        return (logits, cache)
    out = CausalLMOutputWithPast(logits=logits, past_key_values=cache,  # type: ignore[arg-type]
                                 hidden_states=tuple(hidden) if hidden is not None else None)  # fmt: skip
    return out if return_dict is not False else out.to_tuple()
