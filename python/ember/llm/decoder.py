"""The decoder stack on ember's kernels: a family's layers (families.py) run from the model's own parameters, with
the keys and values in ember's paged cache.

One forward takes T new positions of B sequences (a prompt, or the tokens being decoded) and, per layer (Llama's
wiring; the family's table changes the parts):

    normed = RMSNorm(x)                                   row_norm
    q, k, v = normed @ Wq, Wk, Wv (+ bias)                 the Linear router: skinny (decode) or oneDNN (prefill)
    q, k rotated (RoPE, the model's cos/sin)              rotary_embedding, into [B, T, H, D] buffers
    k, v stored in the cache                              KVCache.write
    attention: a fresh prompt on flash attention over its own keys; tokens continuing a cached sequence over the
               cache (attention_over_cache, split along the cached keys)
    x = x + attention @ Wo                                the residual add in the matmul's epilogue
    x = x + down(silu(normed2 @ Wgate) * (normed2 @ Wup)) the gate's SiLU and the product in the epilogues

The arithmetic follows Hugging Face's modules (float32 statistics and sums, bf16 storage); the differences are in
rounding only (one rounding where torch rounds each elementwise op), at autocast's level under bf16.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from ember._tensor import sync_threads
from ember.llm import kernels, moe, ops
from ember.llm.cache import KVCacheBase
from ember.llm.decode_replay import DecodeReplays
from ember.llm.families import Family


def _get(module: Any, path: str) -> Any:
    """The attribute at a dotted ``path`` ("" for the module itself)."""
    for name in filter(None, path.split(".")):
        module = getattr(module, name)
    return module


def _norm(module: nn.Module, kind: str, offset: float = 0.0) -> kernels.Norm:
    """A norm module's parameters; with an ``offset`` (Gemma's RMSNorm scales by 1 + weight), the scale is computed
    once in float32, as Gemma computes it on each call."""
    if getattr(module, "weight", None) is None:
        raise NotImplementedError(f"ember.llm: a {type(module).__name__} without a weight (elementwise_affine=False)")
    weight = cast(torch.Tensor, module.weight).detach()
    if offset:
        weight = weight.float() + offset
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if eps is None:
        raise NotImplementedError(f"ember.llm: {type(module).__name__} has no epsilon ember can read")
    bias = getattr(module, "bias", None) if kind == "layer" else None
    return kernels.Norm(kind, weight, None if bias is None else bias.detach(), float(eps))


@dataclass
class Layer:
    """One decoder layer's kernels and sizes."""

    index: int
    input_norm: kernels.Norm
    post_attention_norm: kernels.Norm | None  # None: the MLP reads the attention's normed input (Falcon-7B)
    sandwich: tuple[kernels.Norm, kernels.Norm] | None  # Gemma 2: the MLP's input norm and its output's norm
    qkv: list[kernels.InPlaceLinear]  # q, k, v; or one fused projection
    o: kernels.InPlaceLinear
    q_norm: kernels.Norm | None
    k_norm: kernels.Norm | None
    mlp_in: list[kernels.InPlaceLinear]  # gated: gate, up; plain: fc_in (empty for a mixture of experts)
    mlp_out: kernels.InPlaceLinear | None
    moe: moe.MoE | None
    parallel: bool  # attention and MLP side by side off the layer's input
    window: int  # sliding window's keys; 0: none


@dataclass(frozen=True)
class Shape:
    heads: int
    kv_heads: int
    head_dim: int
    scale: float
    activation: str  # the MLP's activation as an epilogue entry
    softcap: float  # the attention scores' soft cap, 0 for none


_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
                "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh", "relu": "relu"}  # fmt: skip


def shape_of(config: Any, attention: nn.Module, family: Family) -> Shape:
    heads = int(config.num_attention_heads)
    kv = family.kv_heads
    kv_heads = kv if isinstance(kv, int) else int(getattr(config, kv, None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    scale = float(getattr(attention, "scaling", head_dim**-0.5))
    if (
        getattr(config, "scale_attn_by_inverse_layer_idx", False)
        or getattr(config, "scale_attn_weights", True) is False
    ):
        raise NotImplementedError("ember.llm: GPT-2's attention scaled other than by 1/sqrt(head_dim)")
    act = str(getattr(config, family.activation, "silu"))
    if act not in _ACTIVATIONS:
        raise NotImplementedError(f"ember.llm: the activation {act!r} is not one ember's MLP computes")
    softcap = float(getattr(config, family.attention_softcap, None) or 0.0) if family.attention_softcap else 0.0
    return Shape(heads, kv_heads, head_dim, scale, _ACTIVATIONS[act], softcap)


def window_of(config: Any, index: int, alternating: bool = False) -> int:
    """The sliding window of layer ``index`` (Hugging Face's ``layer_types``, or every layer where only
    ``sliding_window`` is set), 0 for full attention."""
    window = getattr(config, "sliding_window", None)
    if not window:
        return 0
    types = getattr(config, "layer_types", None)
    if types is not None:
        return int(window) if types[index] == "sliding_attention" else 0
    if getattr(config, "use_sliding_window", True) is False:
        return 0
    if alternating:  # (transformers before layer_types: Gemma 2's even layers are the local ones)
        return int(window) if index % 2 == 0 else 0
    return int(window)


def check(model: nn.Module, family: Family) -> None:
    """Raises NotImplementedError where the model computes something its family's table cannot say (OPT-350m's
    post-norm layers, a LayerNorm without a weight, an activation ember's epilogues lack), before anything changes."""
    config = model.config
    base = _get(model, family.decoder)
    if getattr(config, "do_layer_norm_before", True) is False or getattr(base, "project_in", None) is not None:
        raise NotImplementedError("ember.llm: OPT's post-norm layers and projections in and out (OPT-350m)")
    blocks = cast(nn.ModuleList, _get(base, family.layers))
    shape_of(config, _get(blocks[0], family.attention), family)
    _norm(_get(base, family.final_norm), family.norm)
    for block in blocks:
        for name in (family.input_norm, family.post_attention_norm, *(family.sandwich_norms or ())):
            if name:
                _norm(_get(block, name), family.norm)


class Decoder:
    """A causal LM's decoder on ember's kernels, built from a family's table over the model's own modules."""

    def __init__(self, model: nn.Module, family: Family, dtype: torch.dtype) -> None:
        config = model.config  # (optimize has run check() on the model first)
        base = _get(model, family.decoder)
        self.family = family
        self.dtype = dtype
        self.config = config
        # The embeddings as the model names them (its own accessors, where it has them: the attribute names changed
        # between transformers versions, GPT-NeoX's embed_out became lm_head)
        get_in, get_out = getattr(model, "get_input_embeddings", None), getattr(model, "get_output_embeddings", None)
        self.embed = cast(nn.Module, get_in() if get_in is not None else _get(base, family.embed))
        self.positions = cast(nn.Module, _get(base, family.positions)) if family.positions else None
        self.rotary = cast(nn.Module, _get(base, family.rotary)) if family.rotary else None
        self.final_norm = _norm(_get(base, family.final_norm), family.norm, family.norm_offset)
        self.final_softcap = float(getattr(config, family.final_softcap, None) or 0.0) if family.final_softcap else 0.0
        # Gemma scales the token embeddings by sqrt(hidden): transformers 5's embedding module does it itself
        self.embed_scale = family.embed_scale and not hasattr(self.embed, "embed_scale")
        self.lm_head = self._linear(get_out() if get_out is not None else _get(model, family.lm_head))
        blocks = cast(nn.ModuleList, _get(base, family.layers))
        self.shape = shape_of(config, _get(blocks[0], family.attention), family)
        parallel = family.parallel_residual
        self.parallel = bool(getattr(config, parallel, False) if isinstance(parallel, str) else parallel)
        self.layers = [self._layer(i, block) for i, block in enumerate(blocks)]
        self.replays = DecodeReplays()

    def _linear(self, module: nn.Module, rows: slice | None = None) -> kernels.InPlaceLinear:
        weight = cast(torch.Tensor, module.weight).detach()
        bias = getattr(module, "bias", None)
        if not isinstance(module, nn.Linear):  # Hugging Face's Conv1D: [in, out]
            weight = weight.t()
        if rows is not None:
            weight = weight[rows]
            bias = None if bias is None else bias[rows]
        return kernels.InPlaceLinear(weight, None if bias is None else bias.detach())

    def _projections(self, parent: nn.Module, names: tuple[str, ...], splits: list[int]) -> list[kernels.InPlaceLinear]:
        """The named projections; one fused projection of rows stacked as ``splits`` is read as that many layers,
        each a block of its rows where they lie (an in-place view, no copy), unless its rows interleave."""
        if len(names) > 1:
            return [self._linear(_get(parent, n)) for n in names]
        fused = _get(parent, names[0])
        conv1d = not isinstance(fused, nn.Linear)  # GPT-2's [in, out] weights: packed whole, not read as row blocks
        if conv1d or (names == self.family.qkv and self.family.qkv_layout != "stacked"):
            return [self._linear(fused)]  # one call; its output split by views (_qkv)
        bounds = [sum(splits[:i]) for i in range(len(splits) + 1)]
        return [self._linear(fused, slice(a, b)) for a, b in zip(bounds, bounds[1:])]

    def _layer(self, index: int, block: nn.Module) -> Layer:
        f, s = self.family, self.shape
        attn = _get(block, f.attention)
        mlp = _get(block, f.mlp)
        qkv_rows = [s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim]
        mixture, mlp_in, mlp_out = None, [], None
        if moe.is_moe(mlp):
            mixture = moe.build(mlp, self.config, self._linear, s.activation)
        else:
            mlp_out = self._linear(_get(mlp, f.mlp_out))
            intermediate = mlp_out.weight.shape[1]  # (read as [out, in] whatever the module stores)
            mlp_in = self._projections(mlp, f.mlp_in, [intermediate, intermediate] if f.gated else [intermediate])
        return Layer(
            index=index,
            input_norm=_norm(_get(block, f.input_norm), f.norm, f.norm_offset),
            post_attention_norm=(
                _norm(_get(block, f.post_attention_norm), f.norm, f.norm_offset) if f.post_attention_norm else None
            ),
            sandwich=(
                (
                    _norm(_get(block, f.sandwich_norms[0]), f.norm, f.norm_offset),
                    _norm(_get(block, f.sandwich_norms[1]), f.norm, f.norm_offset),
                )
                if f.sandwich_norms
                else None
            ),
            qkv=self._projections(attn, f.qkv, qkv_rows),
            o=self._linear(_get(attn, f.o)),
            q_norm=_norm(_get(attn, f.q_norm), "rms") if f.q_norm else None,
            k_norm=_norm(_get(attn, f.k_norm), "rms") if f.k_norm else None,
            mlp_in=mlp_in,
            mlp_out=mlp_out,
            moe=mixture,
            parallel=self.parallel,
            window=window_of(self.config, index, f.alternating_window),
        )

    @property
    def layer_count(self) -> int:
        return len(self.layers)

    # --- the forward ---------------------------------------------------------------------------------------------

    def forward(
        self,
        input_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        cache: KVCacheBase | None,
        logits_to_keep: int | torch.Tensor = 0,
        hidden_states: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Logits of the kept positions (``logits_to_keep``: the last n, 0 for all, or a tensor of indices);
        ``hidden_states``, when given, receives the input of each layer and the final normed output."""
        sync_threads()
        if inputs_embeds is None:
            assert input_ids is not None
            x = self.embed(input_ids)
        else:
            x = inputs_embeds
        if self.embed_scale:
            x = x * torch.tensor(x.shape[-1] ** 0.5, dtype=x.dtype)
        batch, tokens, hidden = x.shape
        seen = cache.seen if cache is not None else 0
        if position_ids is None:
            if self.family.positions_from_mask and attention_mask is not None and attention_mask.dim() == 2:
                counted = attention_mask.long().cumsum(dim=1) * attention_mask.long() - 1
                position_ids = counted[:, -tokens:]
            else:
                position_ids = torch.arange(seen, seen + tokens).unsqueeze(0)
        if self.positions is not None:
            table = cast(torch.Tensor, self.positions.weight)
            x = x + torch.nn.functional.embedding(position_ids + self.family.position_offset, table)
        x = x.to(self.dtype).contiguous()
        cos = sin = None
        if self.rotary is not None:
            cos, sin = self.rotary(x, position_ids)
            # [B, 1, T, R]: one layout for every call, so that a recorded decode step reads each run's tables alike
            cos = cos.to(self.dtype).unsqueeze(1).expand(batch, 1, tokens, -1).contiguous()
            sin = sin.to(self.dtype).unsqueeze(1).expand(batch, 1, tokens, -1).contiguous()
        keep = _kept_positions(attention_mask, batch, tokens)
        before = cache.begin(batch, keep, tokens) if cache is not None else [0] * batch
        try:
            plan = _AttentionPlan.of(keep, before, tokens)
            x2 = x.view(batch * tokens, hidden)
            decode_step = (
                cache is not None
                and tokens == 1
                and plan.keep is None
                and plan.all_cached
                and hidden_states is None
                and isinstance(logits_to_keep, int)
                and logits_to_keep in (0, 1)
            )
            step = Step(batch, tokens, cos, sin, cache, plan)
            if cache is not None and decode_step and self.replays.enabled:
                logits = torch.empty(batch, self.lm_head.out_features, dtype=self.dtype)

                def decode(calls: ops.Calls, out: torch.Tensor) -> torch.Tensor:
                    return self.run(calls, x2, step, logits=out)

                tables = () if cos is None or sin is None else (cos, sin)
                logits = self.replays.run(decode, (x2, *tables), logits, cache)
            else:
                logits = self.run(ops.Calls(), x2, step, logits_to_keep, hidden_states)
            if cache is not None:
                cache.commit(keep, tokens)
        except BaseException:
            if cache is not None:
                cache.cancel()
            raise
        if self.final_softcap:  # Gemma 2: logits soft-capped as Hugging Face caps them, in their dtype
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits.view(batch, -1, logits.shape[-1])

    def run(
        self,
        calls: ops.Calls,
        x: torch.Tensor,
        step: Step,
        logits_to_keep: int | torch.Tensor = 0,
        hidden_states: list[torch.Tensor] | None = None,
        logits: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Every layer, the final norm and the LM head on ``calls``: logits [rows kept, vocab] (into ``logits``
        when given)."""
        hidden, batch, tokens = x.shape[-1], step.batch, step.tokens
        pending: torch.Tensor | None = None  # a sandwich layer's last addend, added into the next norm's pass
        for layer in self.layers:
            if hidden_states is not None:
                hidden_states.append((x if pending is None else x + pending).view(batch, tokens, hidden))
            x, pending = self._layer_forward(calls, layer, x, pending, step)
        kept = _kept_rows(x.view(batch, tokens, hidden), logits_to_keep, tokens)
        if pending is None:
            normed = calls.norm(kept, self.final_norm)
        else:  # the stream's last sum, made in the final norm's pass
            residual = _kept_rows(pending.view(batch, tokens, hidden), logits_to_keep, tokens)
            normed = calls.norm(residual, self.final_norm, residual=kept)
        if hidden_states is not None:
            hidden_states.append(normed.view(batch, -1, hidden))
        return calls.linear(self.lm_head, normed, out=logits)

    def _qkv(
        self, calls: ops.Calls, layer: Layer, normed: torch.Tensor, batch: int, tokens: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [B, T, Hq, D], k and v [B, T, Hkv, D]: three projections, or views into one fused projection's output."""
        s = self.shape
        if len(layer.qkv) == 3:
            q, k, v = (calls.linear(lin, normed) for lin in layer.qkv)
            return (q.view(batch, tokens, s.heads, s.head_dim), k.view(batch, tokens, s.kv_heads, s.head_dim),
                    v.view(batch, tokens, s.kv_heads, s.head_dim))  # fmt: skip
        fused = calls.linear(layer.qkv[0], normed)
        if self.family.qkv_layout == "per_head":  # [head][q | k | v] (GPT-NeoX: multi-head, no grouping)
            per_head = fused.view(batch, tokens, s.heads, 3 * s.head_dim)
            d = s.head_dim
            return per_head[..., :d], per_head[..., d : 2 * d], per_head[..., 2 * d :]
        if self.family.qkv_layout == "grouped":  # [kv head][its q heads | k | v] (Falcon's new architecture)
            group = s.heads // s.kv_heads
            grouped = fused.view(batch, tokens, s.kv_heads, group + 2, s.head_dim)
            q = calls.empty((batch, tokens, s.heads, s.head_dim), fused.dtype)
            calls.copy(grouped[:, :, :, :group], q.view(batch, tokens, s.kv_heads, group, s.head_dim))
            return q, grouped[:, :, :, group], grouped[:, :, :, group + 1]
        nq, nk = s.heads * s.head_dim, s.kv_heads * s.head_dim
        q = fused[:, :nq].view(batch, tokens, s.heads, s.head_dim)
        k = fused[:, nq : nq + nk].view(batch, tokens, s.kv_heads, s.head_dim)
        v = fused[:, nq + nk :].view(batch, tokens, s.kv_heads, s.head_dim)
        return q, k, v

    def _layer_forward(
        self, calls: ops.Calls, layer: Layer, x: torch.Tensor, pending: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The layer on the residual stream x (+ ``pending``, a sandwich layer's last addend, summed in this layer's
        first norm): the stream after it, and its own pending addend (None but for sandwich norms)."""
        s = self.shape
        batch, tokens, cos, sin, cache, plan = step.batch, step.tokens, step.cos, step.sin, step.cache, step.plan
        if pending is not None:
            stream = calls.empty(x.shape, x.dtype)
            normed = calls.norm(pending, layer.input_norm, residual=x, sum_out=stream)
            x = stream
        else:
            normed = calls.norm(x, layer.input_norm)
        q, k, v = self._qkv(calls, layer, normed, batch, tokens)
        if layer.q_norm is not None:
            q = calls.norm(q, layer.q_norm, out=q if q.is_contiguous() else None)
        if layer.k_norm is not None:
            k = calls.norm(k, layer.k_norm, out=k if k.is_contiguous() else None)
        if cos is not None and sin is not None:
            q_rot = calls.empty(q.shape, q.dtype)
            k_rot = calls.empty(k.shape, k.dtype)
            calls.rope(q.transpose(1, 2), cos, sin, q_rot.transpose(1, 2))
            calls.rope(k.transpose(1, 2), cos, sin, k_rot.transpose(1, 2))
            q, k = q_rot, k_rot
        if cache is not None:
            calls.kv_write(cache, layer.index, k, v, plan.keep)
        attended = calls.empty((batch, tokens, s.heads, s.head_dim), x.dtype)
        if cache is not None and plan.over_cache:
            calls.attend_cache(q.transpose(1, 2), cache, layer.index, plan.key_limits, layer.window, s.scale,
                               attended.transpose(1, 2), s.softcap)  # fmt: skip
        else:
            mask, causal = plan.prompt_mask(layer.window, tokens)
            calls.attend_prompt(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask, causal, s.scale,
                                attended.transpose(1, 2), s.softcap)  # fmt: skip
        flat = attended.view(batch * tokens, s.heads * s.head_dim)
        if layer.sandwich is not None:  # Gemma 2: x + norm(attention), then norm(that) into the MLP
            assert layer.post_attention_norm is not None and layer.mlp_out is not None
            attention_normed = calls.norm(calls.linear(layer.o, flat), layer.post_attention_norm)
            after_attention = calls.empty(x.shape, x.dtype)
            normed = calls.norm(attention_normed, layer.sandwich[0], residual=x, sum_out=after_attention)
            gated = calls.linear(layer.mlp_in[0], normed, (s.activation,))
            inner = calls.linear(layer.mlp_in[1], normed, ("mul",), gated)
            return after_attention, calls.norm(calls.linear(layer.mlp_out, inner), layer.sandwich[1])
        after_attention = calls.linear(layer.o, flat, ("add",), x)
        # The MLP reads the layer's input (side by side with the attention) or the sum after the attention, normed
        # by its own norm, or (Falcon-7B) the attention's normed input itself.
        if layer.post_attention_norm is not None:
            normed = calls.norm(x if layer.parallel else after_attention, layer.post_attention_norm)
        if layer.moe is not None:
            return calls.mixture(layer.moe, normed, after_attention), None
        assert layer.mlp_out is not None
        if len(layer.mlp_in) == 2:
            gated = calls.linear(layer.mlp_in[0], normed, (s.activation,))
            inner = calls.linear(layer.mlp_in[1], normed, ("mul",), gated)
        else:
            inner = calls.linear(layer.mlp_in[0], normed, (s.activation,))
        return calls.linear(layer.mlp_out, inner, ("add",), after_attention), None


def _kept_rows(x: torch.Tensor, logits_to_keep: int | torch.Tensor, tokens: int) -> torch.Tensor:
    """The rows of x [B, T, H] whose logits are kept (the last n, all for 0, or the positions a tensor names), as
    [rows, H]."""
    if isinstance(logits_to_keep, int):
        if 0 < logits_to_keep < tokens:
            x = x[:, -logits_to_keep:]
    else:
        x = x[:, logits_to_keep]
    return x.reshape(-1, x.shape[-1])


def _kept_positions(attention_mask: torch.Tensor | None, batch: int, tokens: int) -> torch.Tensor | None:
    """The new positions to store ([B, T] bool: the attention mask's last T columns), None when all are."""
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2:
        raise NotImplementedError(
            "ember.llm: the attention mask must be Hugging Face's 2-D [batch, positions] padding mask, got "
            f"{tuple(attention_mask.shape)}"
        )
    new = attention_mask[:, -tokens:]
    if new.shape != (batch, tokens):
        raise ValueError(
            f"ember.llm: attention_mask {tuple(attention_mask.shape)} does not cover the {tokens} new positions of "
            f"{batch} sequences"
        )
    keep = new.to(torch.bool)
    return None if bool(keep.all()) else keep.contiguous()


@dataclass(frozen=True)
class Step:
    """What one forward's layers share: its batch and new positions, the rotary tables (None without a rotary
    embedding), the cache, and how its attention runs."""

    batch: int
    tokens: int
    cos: torch.Tensor | None
    sin: torch.Tensor | None
    cache: KVCacheBase | None
    plan: _AttentionPlan


@dataclass
class _AttentionPlan:
    """How this forward's attention runs: over the cache (tokens continuing cached sequences, each query's visible
    keys given by ``key_limits`` where padding makes them uneven) or over the prompt's own keys (``keep`` masking
    padding)."""

    keep: torch.Tensor | None
    over_cache: bool
    key_limits: torch.Tensor | None
    all_cached: bool  # every sequence has tokens in the cache already

    @staticmethod
    def of(keep: torch.Tensor | None, before: list[int], tokens: int) -> _AttentionPlan:
        over_cache = any(n > 0 for n in before)
        limits = None
        if over_cache and keep is not None:
            # Query t of sequence b sees the keys stored before the forward and its kept tokens up to t.
            limits = torch.tensor(before, dtype=torch.int64).unsqueeze(1) + keep.to(torch.int64).cumsum(dim=1)
        return _AttentionPlan(keep, over_cache, limits, all(n > 0 for n in before))

    def prompt_mask(self, window: int, tokens: int) -> tuple[torch.Tensor | None, bool]:
        """The mask and causal flag of a prompt's attention over its own keys: the causal triangle, padding keys
        masked, and the sliding window where the prompt is longer than it."""
        keys = None if self.keep is None else self.keep[:, None, None, :]
        if window <= 0 or tokens <= window:
            return keys, True
        i = torch.arange(tokens)
        visible = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < window)
        mask = visible[None, None] if keys is None else visible[None, None] & keys
        return mask, False
