"""The model families ``ember.llm.optimize`` knows: for each Hugging Face ``model_type``, where its decoder keeps its
parts (attribute names, read from the model as it is) and what its layers compute. Tables, not copies of Hugging
Face's code: the decoder (decoder.py) runs any family from its table, and a family that computes something its
table cannot say is not listed here (the model then runs unchanged, ``optimize`` says so).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Family:
    """Attribute names of a causal LM's parts, from the ``...ForCausalLM`` module down."""

    name: str
    decoder: str = "model"  # the base model inside the causal LM
    layers: str = "layers"  # its nn.ModuleList of decoder layers
    embed: str = "embed_tokens"
    final_norm: str = "norm"
    rotary: str = "rotary_emb"  # the module that makes (cos, sin) for position ids
    lm_head: str = "lm_head"
    # in each decoder layer
    attention: str = "self_attn"
    q: str = "q_proj"
    k: str = "k_proj"
    v: str = "v_proj"
    o: str = "o_proj"
    q_norm: str | None = None  # RMSNorm over each head's features before the rotation (Qwen3)
    k_norm: str | None = None
    mlp: str = "mlp"
    gate: str = "gate_proj"
    up: str = "up_proj"
    down: str = "down_proj"
    input_norm: str = "input_layernorm"
    post_attention_norm: str = "post_attention_layernorm"


# Llama and the families that kept its layer as it is: a pre-norm residual stream, RMSNorm, grouped-query attention
# with rotate-half RoPE (any of Hugging Face's RoPE scalings: the model's own rotary module makes the tables), and
# the gated MLP. Mistral adds the sliding window, Qwen2 biases on q, k and v, Qwen3 per-head q/k norms.
LLAMA = Family("llama")

FAMILIES: dict[str, Family] = {
    "llama": LLAMA,
    "mistral": replace(LLAMA, name="mistral"),
    "qwen2": replace(LLAMA, name="qwen2"),
    "qwen3": replace(LLAMA, name="qwen3", q_norm="q_norm", k_norm="k_norm"),
}


def family_of(model_type: str) -> Family | None:
    return FAMILIES.get(model_type)
