"""The model families ``ember.llm.optimize`` knows: for each Hugging Face ``model_type``, where its decoder keeps its
parts (attribute names, read from the model as it is) and how its layers are wired. Tables, not copies of Hugging
Face's code: the decoder (decoder.py) runs any family from its table, and a family whose layers compute something a
table cannot say is not listed (the model then runs unchanged, and ``optimize`` says so).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Family:
    """Attribute names of a causal LM's parts, from the ``...ForCausalLM`` module down, and its layers' wiring."""

    name: str
    decoder: str = "model"  # the base model inside the causal LM
    layers: str = "layers"  # its nn.ModuleList of decoder layers
    embed: str = "embed_tokens"
    positions: str | None = None  # learned position embeddings added to the tokens' (GPT-2's wpe)
    position_offset: int = 0  # added to a position before its embedding is looked up (OPT's 2)
    # positions counted over the attention mask's real tokens where none are given (OPT), not from the cache's length
    positions_from_mask: bool = False
    final_norm: str = "norm"
    rotary: str | None = "rotary_emb"  # the module making (cos, sin) for position ids; None: no rotary embedding
    lm_head: str = "lm_head"
    # in each decoder layer
    attention: str = "self_attn"
    qkv: tuple[str, ...] = ("q_proj", "k_proj", "v_proj")  # three projections, or one fused
    # a fused projection's output: "stacked" [q | k | v] (Phi-3, GPT-2), "per_head" [head][q | k | v] (GPT-NeoX), or
    # "grouped" [key/value head][its query heads | k | v] (Falcon's new decoder architecture)
    qkv_layout: str = "stacked"
    kv_heads: str | int = "num_key_value_heads"  # the config attribute counting key/value heads, or the count
    o: str = "o_proj"
    q_norm: str | None = None  # RMSNorm over each head's features before the rotation (Qwen3)
    k_norm: str | None = None
    mlp: str = "mlp"  # "" for the layer itself
    gated: bool = True  # act(gate(x)) * up(x), else act(fc_in(x))
    mlp_in: tuple[str, ...] = ("gate_proj", "up_proj")  # gated: gate and up, or one fused [gate | up]; else fc_in
    mlp_out: str = "down_proj"
    input_norm: str = "input_layernorm"
    post_attention_norm: str | None = "post_attention_layernorm"  # None: the MLP reads the attention's normed input
    norm: str = "rms"  # "rms" (RMSNorm) or "layer" (LayerNorm, with a bias)
    norm_offset: float = 0.0  # RMSNorm scales by (offset + weight) in float32 (Gemma's 1)
    embed_scale: bool = False  # token embeddings times sqrt(hidden) (Gemma), unless the embedding module scales them
    # norms of the attention's and the MLP's outputs before each residual add, and the MLP's input norm (Gemma 2's
    # four norms a layer: input, post-attention, pre-feedforward, post-feedforward)
    sandwich_norms: tuple[str, str] | None = None
    attention_softcap: str | None = None  # the config attribute of the attention scores' soft cap (Gemma 2)
    final_softcap: str | None = None  # the config attribute of the logits' soft cap (Gemma 2)
    alternating_window: bool = False  # without layer_types, every other layer (the even ones) has the window
    # x + attention(norm1(x)) + mlp(norm2(x)) where set: a config attribute's name, or True
    parallel_residual: str | bool = False
    activation: str = "hidden_act"  # the config attribute naming the MLP's activation
    # fields a model's config decides (Falcon's layouts and norms): config -> {field: value}; raises
    # NotImplementedError for a form the table cannot say
    variant: Callable[[Any], dict[str, Any]] | None = None

    def for_config(self, config: Any) -> Family:
        return replace(self, **self.variant(config)) if self.variant is not None else self


def _falcon(config: Any) -> dict[str, Any]:
    """Falcon's forms: the new decoder architecture (40B, 180B: grouped q/k/v, one or two norms side by side),
    multi-query (7B: [q heads | k | v]), or per-head q/k/v; the attention and the MLP side by side or in turn."""
    if getattr(config, "alibi", False):
        raise NotImplementedError("ember.llm: Falcon with ALiBi positions")
    new = bool(getattr(config, "new_decoder_architecture", False))
    parallel = new or bool(getattr(config, "parallel_attn", True))
    layout = "grouped" if new else ("stacked" if getattr(config, "multi_query", True) else "per_head")
    if new and (getattr(config, "num_ln_in_parallel_attn", None) or 2) == 2:
        norms: tuple[str, str | None] = ("ln_attn", "ln_mlp")
    elif parallel:
        norms = ("input_layernorm", None)
    else:
        norms = ("input_layernorm", "post_attention_layernorm")
    heads = int(config.num_attention_heads)
    kv_heads = int(config.num_kv_heads or heads) if new else (1 if layout == "stacked" else heads)
    return {"qkv_layout": layout, "parallel_residual": parallel, "input_norm": norms[0],
            "post_attention_norm": norms[1], "kv_heads": kv_heads}  # fmt: skip


# Llama and the families that kept its layer: a pre-norm residual stream, RMSNorm, grouped-query attention with
# rotate-half RoPE (any of Hugging Face's RoPE scalings: the model's own rotary module makes the tables), and the
# gated MLP. Mistral adds the sliding window, Qwen2 biases on q, k and v, Qwen3 per-head q/k norms; Phi-3 fuses q, k
# and v into one projection and gate and up into another (a partial rotary embedding where its config says so).
LLAMA = Family("llama")

FAMILIES: dict[str, Family] = {
    "llama": LLAMA,
    "mistral": replace(LLAMA, name="mistral"),
    "qwen2": replace(LLAMA, name="qwen2"),
    "qwen3": replace(LLAMA, name="qwen3", q_norm="q_norm", k_norm="k_norm"),
    # Mixtral and Qwen2-MoE: Llama's attention, a mixture of experts for the MLP (moe.py; Qwen2-MoE's shared expert
    # and its dense layers where mlp_only_layers / decoder_sparse_step say)
    "mixtral": replace(LLAMA, name="mixtral"),
    "qwen2_moe": replace(LLAMA, name="qwen2_moe"),
    "phi3": replace(LLAMA, name="phi3", qkv=("qkv_proj",), mlp_in=("gate_up_proj",)),
    # GPT-NeoX (Pythia): LayerNorm, q/k/v fused per head, a partial rotary embedding, a GELU MLP, and the attention
    # and the MLP side by side off the same input where use_parallel_residual is set.
    "gpt_neox": Family(
        "gpt_neox",
        decoder="gpt_neox",
        embed="embed_in",
        final_norm="final_layer_norm",
        attention="attention",
        qkv=("query_key_value",),
        qkv_layout="per_head",
        o="dense",
        gated=False,
        mlp_in=("dense_h_to_4h",),
        mlp_out="dense_4h_to_h",
        norm="layer",
        parallel_residual="use_parallel_residual",
    ),
    # Gemma 2: RMSNorm by (1 + weight), embeddings scaled by sqrt(hidden), four norms a layer, soft caps on the
    # attention scores and the logits, local (sliding-window) and global layers in turn, a gated tanh-GELU MLP.
    "gemma2": replace(
        LLAMA,
        name="gemma2",
        norm_offset=1.0,
        embed_scale=True,
        sandwich_norms=("pre_feedforward_layernorm", "post_feedforward_layernorm"),
        attention_softcap="attn_logit_softcapping",
        final_softcap="final_logit_softcapping",
        alternating_window=True,
        activation="hidden_activation",
    ),
    # OPT: learned positions (offset by 2, counted over the real tokens), LayerNorm before attention and MLP, ReLU
    # MLP on the layer itself. (OPT-350m's post-norm layers and projections in and out are not built.)
    "opt": Family(
        "opt",
        decoder="model.decoder",
        positions="embed_positions",
        position_offset=2,
        positions_from_mask=True,
        final_norm="final_layer_norm",
        rotary=None,
        o="out_proj",
        gated=False,
        mlp="",
        mlp_in=("fc1",),
        mlp_out="fc2",
        input_norm="self_attn_layer_norm",
        post_attention_norm="final_layer_norm",
        norm="layer",
        activation="activation_function",
    ),
    # Falcon: LayerNorm, fused q/k/v in one of three layouts, a GELU MLP, the parallel forms (_falcon).
    "falcon": Family(
        "falcon",
        decoder="transformer",
        layers="h",
        embed="word_embeddings",
        final_norm="ln_f",
        attention="self_attention",
        qkv=("query_key_value",),
        o="dense",
        gated=False,
        mlp_in=("dense_h_to_4h",),
        mlp_out="dense_4h_to_h",
        norm="layer",
        kv_heads="num_kv_heads",
        activation="activation",
        variant=_falcon,
    ),
    # GPT-2: learned positions instead of a rotation, LayerNorm, Conv1D layers ([in, out] weights), a GELU MLP.
    "gpt2": Family(
        "gpt2",
        decoder="transformer",
        layers="h",
        embed="wte",
        positions="wpe",
        final_norm="ln_f",
        rotary=None,
        attention="attn",
        qkv=("c_attn",),
        o="c_proj",
        gated=False,
        mlp_in=("c_fc",),
        mlp_out="c_proj",
        input_norm="ln_1",
        post_attention_norm="ln_2",
        norm="layer",
        activation="activation_function",
    ),
}


def family_of(model_type: str, config: Any = None) -> Family | None:
    """The family of ``model_type`` in the form ``config`` takes (NotImplementedError where no table says it)."""
    family = FAMILIES.get(model_type)
    return family.for_config(config) if family is not None and config is not None else family
