"""
ember._C: the pybind11 binding of ember's C++ core (stubs: ember/_C.pyi, made by scripts/stubs.sh)
"""

from __future__ import annotations

import collections.abc
import typing

import typing_extensions

import ember._tensor

__all__: list[str] = [
    "AdagradOptions",
    "AdamOptions",
    "Convolution",
    "KVCachePool",
    "LambOptions",
    "LarsOptions",
    "Linear",
    "PagedKVCache",
    "Replay",
    "SgdOptions",
    "TensorMarks",
    "ThreadPin",
    "active_isa",
    "adagrad_step",
    "adam_step",
    "attention_implementation",
    "attention_over_cache",
    "avg_pool2d",
    "bf16_implementation",
    "bf16_join",
    "bf16_round",
    "bf16_split",
    "build_info",
    "convert_tensors",
    "cpu_features",
    "describe_tensor",
    "detected_isa",
    "dropout",
    "dropout_implementation",
    "embedding_bag_implementation",
    "frozen_batch_norm",
    "frozen_batch_norm_backward",
    "frozen_batch_norm_implementation",
    "interaction_backward",
    "interaction_forward",
    "interaction_implementation",
    "interaction_output_width",
    "isa_levels",
    "lamb_step",
    "lars_step",
    "last_level_cache_bytes",
    "max_isa",
    "max_pool2d",
    "max_pool2d_implementation",
    "merged_embedding_bag_adagrad_update",
    "merged_embedding_bag_backward",
    "merged_embedding_bag_forward",
    "merged_embedding_bag_per_sample_weights_backward",
    "merged_embedding_bag_sgd_update",
    "multiply",
    "nms",
    "nms_implementation",
    "num_threads",
    "onednn_info",
    "openmp_available",
    "pin_thread",
    "pinned_cpus",
    "process_cpus",
    "roi_align_backward",
    "roi_align_forward",
    "roi_align_implementation",
    "rotary_embedding",
    "rotary_embedding_implementation",
    "row_norm",
    "row_norm_implementation",
    "scaled_dot_product_attention",
    "set_max_isa",
    "set_num_threads",
    "set_stream_threshold_bytes",
    "set_thread_affinity",
    "set_threading_backend",
    "set_verbose",
    "sgd_step",
    "stream_threshold_bytes",
    "tbb_version",
    "team_affinity",
    "thread_affinity",
    "threading_backend",
    "unpin_thread",
    "verbose",
]

class AdamOptions:
    """
    Adam's and AdamW's hyper-parameters (ember/optim.h)
    """

    amsgrad: bool
    decoupled_weight_decay: bool
    maximize: bool
    def __init__(
        self,
        *,
        lr: typing.SupportsFloat | typing.SupportsIndex = 0.001,
        beta1: typing.SupportsFloat | typing.SupportsIndex = 0.9,
        beta2: typing.SupportsFloat | typing.SupportsIndex = 0.999,
        eps: typing.SupportsFloat | typing.SupportsIndex = 1e-08,
        weight_decay: typing.SupportsFloat | typing.SupportsIndex = 0.0,
        decoupled_weight_decay: bool = False,
        amsgrad: bool = False,
        maximize: bool = False,
    ) -> None: ...
    def __repr__(self) -> str: ...
    @property
    def beta1(self) -> float: ...
    @beta1.setter
    def beta1(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def beta2(self) -> float: ...
    @beta2.setter
    def beta2(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def eps(self) -> float: ...
    @eps.setter
    def eps(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def lr(self) -> float: ...
    @lr.setter
    def lr(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def weight_decay(self) -> float: ...
    @weight_decay.setter
    def weight_decay(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...

class AdagradOptions:
    """
    Adagrad's hyper-parameters
    """

    maximize: bool
    def __init__(
        self,
        *,
        lr: typing.SupportsFloat | typing.SupportsIndex = 0.01,
        lr_decay: typing.SupportsFloat | typing.SupportsIndex = 0.0,
        weight_decay: typing.SupportsFloat | typing.SupportsIndex = 0.0,
        eps: typing.SupportsFloat | typing.SupportsIndex = 1e-10,
        maximize: bool = False,
    ) -> None: ...
    def __repr__(self) -> str: ...
    @property
    def eps(self) -> float: ...
    @eps.setter
    def eps(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def lr(self) -> float: ...
    @lr.setter
    def lr(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def lr_decay(self) -> float: ...
    @lr_decay.setter
    def lr_decay(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def weight_decay(self) -> float: ...
    @weight_decay.setter
    def weight_decay(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...

class LambOptions:
    """
    Lamb's hyper-parameters
    """

    bias_correction: bool
    maximize: bool
    def __init__(
        self,
        *,
        lr: typing.SupportsFloat | typing.SupportsIndex = 0.001,
        beta1: typing.SupportsFloat | typing.SupportsIndex = 0.9,
        beta2: typing.SupportsFloat | typing.SupportsIndex = 0.999,
        eps: typing.SupportsFloat | typing.SupportsIndex = 1e-06,
        weight_decay: typing.SupportsFloat | typing.SupportsIndex = 0.0,
        bias_correction: bool = True,
        maximize: bool = False,
    ) -> None: ...
    def __repr__(self) -> str: ...
    @property
    def beta1(self) -> float: ...
    @beta1.setter
    def beta1(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def beta2(self) -> float: ...
    @beta2.setter
    def beta2(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def eps(self) -> float: ...
    @eps.setter
    def eps(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def lr(self) -> float: ...
    @lr.setter
    def lr(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def weight_decay(self) -> float: ...
    @weight_decay.setter
    def weight_decay(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...

class SgdOptions:
    """
    SGD's hyper-parameters
    """

    maximize: bool
    nesterov: bool
    def __init__(
        self,
        *,
        lr: typing.SupportsFloat | typing.SupportsIndex = 0.001,
        momentum: typing.SupportsFloat | typing.SupportsIndex = 0.0,
        dampening: typing.SupportsFloat | typing.SupportsIndex = 0.0,
        weight_decay: typing.SupportsFloat | typing.SupportsIndex = 0.0,
        nesterov: bool = False,
        maximize: bool = False,
    ) -> None: ...
    def __repr__(self) -> str: ...
    @property
    def dampening(self) -> float: ...
    @dampening.setter
    def dampening(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def lr(self) -> float: ...
    @lr.setter
    def lr(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def momentum(self) -> float: ...
    @momentum.setter
    def momentum(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def weight_decay(self) -> float: ...
    @weight_decay.setter
    def weight_decay(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...

class LarsOptions:
    """
    LARS's hyper-parameters
    """

    maximize: bool
    nesterov: bool
    def __init__(
        self,
        *,
        lr: typing.SupportsFloat | typing.SupportsIndex = 0.001,
        momentum: typing.SupportsFloat | typing.SupportsIndex = 0.9,
        dampening: typing.SupportsFloat | typing.SupportsIndex = 0.0,
        weight_decay: typing.SupportsFloat | typing.SupportsIndex = 0.0,
        trust_coefficient: typing.SupportsFloat | typing.SupportsIndex = 0.001,
        eps: typing.SupportsFloat | typing.SupportsIndex = 1e-08,
        nesterov: bool = False,
        maximize: bool = False,
    ) -> None: ...
    def __repr__(self) -> str: ...
    @property
    def dampening(self) -> float: ...
    @dampening.setter
    def dampening(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def eps(self) -> float: ...
    @eps.setter
    def eps(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def lr(self) -> float: ...
    @lr.setter
    def lr(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def momentum(self) -> float: ...
    @momentum.setter
    def momentum(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def trust_coefficient(self) -> float: ...
    @trust_coefficient.setter
    def trust_coefficient(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def weight_decay(self) -> float: ...
    @weight_decay.setter
    def weight_decay(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...

class Linear:
    """
    y = epilogue(x @ weight.T + bias) on oneDNN, with the weight reordered once
    """
    @staticmethod
    def route(
        compute: str,
        rows: typing.SupportsInt | typing.SupportsIndex,
        weight: ember._tensor.DLPackTensor,
        in_place: bool,
        caller_mkl_fp32: bool,
    ) -> str:
        """
        Which kernel serves calls of `rows` rows on `weight` ([out_features, in_features] as the caller holds it; only its shape and strides are read): 'caller' where the caller's own matmul (torch's) is the faster one, else 'skinny', 'tiles', 'few_rows', 'swapped' or 'onednn'. `in_place`: the layer runs on that weight where it lies; `caller_mkl_fp32`: the caller's fp32 matmul is MKL's on an Intel CPU.
        """
    @staticmethod
    def skinny_rows(compute: str) -> int:
        """
        Inputs of at most this many rows on a weight in place run on ember's skinny matmul (32 for bf16 where AMX runs, 8 otherwise, under the current ISA cap).
        """
    @staticmethod
    def supported(compute: str) -> bool: ...
    def __init__(
        self,
        weight: ember._tensor.DLPackTensor,
        bias: ember._tensor.DLPackTensor | None,
        compute: str,
        prepack: bool = True,
        rows_hint: typing.SupportsInt | typing.SupportsIndex = 64,
    ) -> None: ...
    def cached_primitives(self) -> int: ...
    def forward(
        self,
        x: ember._tensor.DLPackTensor,
        weight: ember._tensor.DLPackTensor | None,
        out: ember._tensor.DLPackTensor,
        epilogue: collections.abc.Sequence[str] = [],
        residual: ember._tensor.DLPackTensor | None = None,
        kernel: str | None = None,
    ) -> None:
        """
        out = epilogue(x @ weight.T + bias) for x [..., in_features] (an 'add' or 'mul' entry reads residual); out and residual [..., out_features] of x's leading dimensions, read as rows where they lie (no reshape needed). `kernel`: None for the router's choice, or 'onednn' / 'tiles' / 'few_rows' to run that kernel (tests and benchmarks comparing kernels; 'tiles' needs AMX and a prepacked bfloat16 layer, 'few_rows' AVX512-BF16, such a layer and at most 4 rows)
        """
    def implementation(
        self, m: typing.SupportsInt | typing.SupportsIndex, weight: ember._tensor.DLPackTensor | None = None
    ) -> str: ...
    def packed_bytes(self) -> int: ...
    @property
    def compute(self) -> str: ...
    @property
    def in_features(self) -> int: ...
    @property
    def out_features(self) -> int: ...
    @property
    def prepack(self) -> bool: ...

class Convolution:
    """
    y = epilogue(conv(x, weight) + bias) on oneDNN (transposed too), weight reordered once
    """
    @staticmethod
    def supported(compute: str) -> bool: ...
    def __init__(
        self,
        weight: ember._tensor.DLPackTensor,
        bias: ember._tensor.DLPackTensor | None,
        stride: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex],
        padding_l: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex],
        padding_r: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex],
        dilation: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex],
        groups: typing.SupportsInt | typing.SupportsIndex,
        transposed: bool,
        compute: str,
        input_hint: ember._tensor.DLPackTensor,
    ) -> None: ...
    def cached_primitives(self) -> int: ...
    def forward(
        self,
        x: ember._tensor.DLPackTensor,
        out: ember._tensor.DLPackTensor,
        epilogue: collections.abc.Sequence[str] = [],
        residual: ember._tensor.DLPackTensor | None = None,
    ) -> None: ...
    def implementation(self, x: ember._tensor.DLPackTensor) -> str: ...
    def output_shape(
        self, input_shape: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]
    ) -> list[int]: ...
    def packed_bytes(self) -> int: ...
    @property
    def compute(self) -> str: ...
    @property
    def in_channels(self) -> int: ...
    @property
    def out_channels(self) -> int: ...

class KVCachePool:
    """
    Blocks of a paged key/value cache, shared by the caches of one model's generations. See ember/kv_cache.h.
    """
    def __init__(
        self,
        layers: typing.SupportsInt | typing.SupportsIndex,
        heads: typing.SupportsInt | typing.SupportsIndex,
        key_dim: typing.SupportsInt | typing.SupportsIndex,
        value_dim: typing.SupportsInt | typing.SupportsIndex,
        block_tokens: typing.SupportsInt | typing.SupportsIndex,
        dtype: str,
    ) -> None: ...
    def reserve(self, blocks: typing.SupportsInt | typing.SupportsIndex) -> None:
        """
        Grows the pool to at least `blocks` blocks, their pages touched.
        """
    def trim(self) -> int:
        """
        Frees the trailing chunks with no block in use; returns the bytes freed.
        """
    @property
    def block_bytes(self) -> int: ...
    @property
    def block_tokens(self) -> int: ...
    @property
    def blocks(self) -> int: ...
    @property
    def blocks_in_use(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def heads(self) -> int: ...
    @property
    def key_dim(self) -> int: ...
    @property
    def layers(self) -> int: ...
    @property
    def value_dim(self) -> int: ...

class PagedKVCache:
    """
    The key/value cache of a batch of sequences, on blocks of a KVCachePool. See ember/kv_cache.h.
    """
    def __init__(self, pool: KVCachePool) -> None: ...
    def begin(self, counts: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        """
        Starts a step of counts[s] new tokens for each sequence s, reserving their blocks.
        """
    def blocks_held(self) -> int: ...
    def bytes_held(self) -> int: ...
    def cancel(self) -> None:
        """
        Abandons the step.
        """
    def clear(self) -> None:
        """
        Releases every block; no sequences remain.
        """
    def commit(self) -> None:
        """
        Ends the step: each sequence's length grows by its count.
        """
    def length(self, sequence: typing.SupportsInt | typing.SupportsIndex) -> int: ...
    def lengths(self) -> list[int]: ...
    def reorder(self, rows: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        """
        Sequence s becomes what sequence rows[s] was; blocks are shared, not copied.
        """
    def set_sequences(self, count: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def truncate(self, lengths: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        """
        Keeps at most lengths[s] tokens of each sequence s.
        """
    def write(
        self,
        layer: typing.SupportsInt | typing.SupportsIndex,
        k: ember._tensor.DLPackTensor,
        v: ember._tensor.DLPackTensor,
        keep: ember._tensor.DLPackTensor | None = None,
    ) -> None:
        """
        Stores layer `layer`'s keys and values of the step: k [S, T, heads, key_dim], v [S, T, heads, value_dim], the tokens where keep [S, T] (bool) is True, or all.
        """
    @property
    def in_step(self) -> bool: ...
    @property
    def max_length(self) -> int: ...
    @property
    def pool(self) -> KVCachePool: ...
    @property
    def sequences(self) -> int: ...

class Replay:
    """
    Kernel calls recorded from one forward, run again in one call on the tensors of another: each operand a view at a byte offset into a slot (the first `call_slots` given to each run, the rest bound by constant()).
    """
    def __init__(self, call_slots: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def attention(
        self,
        q: typing.Any,
        k: typing.Any,
        v: typing.Any,
        mask: typing.Any,
        causal: bool,
        scale: typing.SupportsFloat | typing.SupportsIndex,
        out: typing.Any,
    ) -> None:
        """
        Appends scaled_dot_product_attention(q, k, v, mask, causal, scale, out).
        """
    def attention_over_cache(
        self,
        q: typing.Any,
        layer: typing.SupportsInt | typing.SupportsIndex,
        window: typing.SupportsInt | typing.SupportsIndex,
        scale: typing.SupportsFloat | typing.SupportsIndex,
        out: typing.Any,
        softcap: typing.SupportsFloat | typing.SupportsIndex = 0.0,
    ) -> None:
        """
        Appends attention_over_cache(q, cache, layer, None, window, scale, out) on the cache of the run.
        """
    def avg_pool2d(
        self,
        x: typing.Any,
        kernel: typing.Annotated[collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], "FixedSize(2)"],
        stride: typing.Annotated[collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], "FixedSize(2)"],
        padding: typing.Annotated[collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], "FixedSize(2)"],
        ceil_mode: bool,
        count_include_pad: bool,
        divisor_override: typing.SupportsInt | typing.SupportsIndex,
        out: typing.Any,
    ) -> None:
        """
        Appends avg_pool2d(x, window, count_include_pad, divisor_override, out) (ember/pool.h).
        """
    def batch_norm(
        self,
        x: typing.Any,
        weight: typing.Any,
        bias: typing.Any,
        mean: typing.Any,
        var: typing.Any,
        eps: typing.SupportsFloat | typing.SupportsIndex,
        relu: bool,
        out: typing.Any,
    ) -> None:
        """
        Appends frozen_batch_norm(x, weight, bias, mean, var, eps, out, relu) (ember/norm.h).
        """
    def constant(self, tensor: ember._tensor.DLPackTensor) -> int:
        """
        Binds `tensor` to the next slot for the replay's life (it is kept alive); returns the slot.
        """
    def convolution(
        self,
        layer: typing.Any,
        x: typing.Any,
        out: typing.Any,
        epilogue: collections.abc.Sequence[str],
        residual: typing.Any,
    ) -> None:
        """
        Appends Convolution.forward(x, out, epilogue, residual).
        """
    def copy(self, src: typing.Any, out: typing.Any) -> None:
        """
        Appends copy(src, out): out (src's dtype and sizes, dense) = src, element for element.
        """
    def gather_rows(self, src: typing.Any, rows: typing.Any, out: typing.Any) -> None:
        """
        Appends gather_rows(src, rows, out): out[i] = src[rows[i]] for a [R, W] src and int64 rows.
        """
    def kv_write(self, layer: typing.SupportsInt | typing.SupportsIndex, k: typing.Any, v: typing.Any) -> None:
        """
        Appends KVCache.write(layer, k, v) on the cache of the run.
        """
    def linear(
        self,
        layer: typing.Any,
        x: typing.Any,
        weight: typing.Any,
        out: typing.Any,
        epilogue: collections.abc.Sequence[str],
        residual: typing.Any,
    ) -> None:
        """
        Appends Linear.forward(x, weight, out, epilogue, residual); each operand a (slot, offset, tensor) tuple or None.
        """
    def max_pool2d(
        self,
        x: typing.Any,
        kernel: typing.Annotated[collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], "FixedSize(2)"],
        stride: typing.Annotated[collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], "FixedSize(2)"],
        padding: typing.Annotated[collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], "FixedSize(2)"],
        dilation: typing.Annotated[collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], "FixedSize(2)"],
        ceil_mode: bool,
        relu: bool,
        out: typing.Any,
    ) -> None:
        """
        Appends max_pool2d(x, window, relu, out) (ember/pool.h).
        """
    def multiply(self, x: typing.Any, factor: typing.Any, out: typing.Any) -> None:
        """
        Appends multiply(x, factor, out) (ember/epilogue.h).
        """
    def rotary_embedding(self, x: typing.Any, cos: typing.Any, sin: typing.Any, out: typing.Any) -> None:
        """
        Appends rotary_embedding(x, cos, sin, out).
        """
    def round_bf16(self, x: typing.Any, out: typing.Any) -> None:
        """
        Appends bf16.round(x, out): a float32 x rounded to bfloat16 (to nearest even).
        """
    def row_norm(
        self,
        kind: str,
        x: typing.Any,
        residual: typing.Any,
        weight: typing.Any,
        bias: typing.Any,
        eps: typing.SupportsFloat | typing.SupportsIndex,
        out: typing.Any,
        sum_out: typing.Any,
        out_bf16: typing.Any,
    ) -> None:
        """
        Appends row_norm(kind, x, residual, weight, bias, eps, out, sum_out, out_bf16).
        """
    def run(self, tensors: collections.abc.Sequence[ember._tensor.DLPackTensor], cache: typing.Any = None) -> None:
        """
        Runs the steps in order on `tensors` (one per call slot), each reaching at least as far as the recorded views into its slot; `cache`: the key/value cache the kv_write and attention_over_cache steps use.
        """
    def zero(self, out: typing.Any) -> None:
        """
        Appends zero(out): every element of out set to zero.
        """
    @property
    def slots(self) -> int: ...
    @property
    def steps(self) -> int: ...

class TensorMarks:
    """
    The tensors every fused layer of a graph was built from, checked in one call (GraphGuard): add(cache, refs) per layer, then check(epoch) on each forward.
    """
    def __init__(self) -> None: ...
    def __len__(self) -> int: ...
    def add(self, cache: typing.Any, refs: collections.abc.Sequence[typing.Any]) -> None: ...
    def check(self, epoch: typing.SupportsInt | typing.SupportsIndex) -> list[int]: ...

class ThreadPin:
    @property
    def cpus(self) -> list[int]: ...

def _raise_error(kind: str, message: str) -> None: ...
def active_isa() -> str: ...
def adagrad_step(
    params: collections.abc.Sequence[ember._tensor.DLPackTensor],
    grads: collections.abc.Sequence[ember._tensor.DLPackTensor],
    state_sums: collections.abc.Sequence[ember._tensor.DLPackTensor],
    steps: collections.abc.Sequence[ember._tensor.DLPackTensor],
    options: AdagradOptions,
    *,
    grad_scale: ember._tensor.DLPackTensor | None = None,
    found_inf: ember._tensor.DLPackTensor | None = None,
    bottoms: collections.abc.Sequence[ember._tensor.DLPackTensor | None] = (),
) -> None: ...
def adam_step(
    params: collections.abc.Sequence[ember._tensor.DLPackTensor],
    grads: collections.abc.Sequence[ember._tensor.DLPackTensor],
    exp_avgs: collections.abc.Sequence[ember._tensor.DLPackTensor],
    exp_avg_sqs: collections.abc.Sequence[ember._tensor.DLPackTensor],
    max_exp_avg_sqs: collections.abc.Sequence[ember._tensor.DLPackTensor],
    steps: collections.abc.Sequence[ember._tensor.DLPackTensor],
    options: AdamOptions,
    *,
    grad_scale: ember._tensor.DLPackTensor | None = None,
    found_inf: ember._tensor.DLPackTensor | None = None,
    bottoms: collections.abc.Sequence[ember._tensor.DLPackTensor | None] = (),
) -> None: ...
def attention_implementation() -> str: ...
def attention_over_cache(
    q: ember._tensor.DLPackTensor,
    cache: PagedKVCache,
    layer: typing.SupportsInt | typing.SupportsIndex,
    key_limits: ember._tensor.DLPackTensor | None,
    window: typing.SupportsInt | typing.SupportsIndex,
    scale: typing.SupportsFloat | typing.SupportsIndex,
    out: ember._tensor.DLPackTensor,
    softcap: typing.SupportsFloat | typing.SupportsIndex = 0.0,
) -> None:
    """
    out = softmax(scale * q @ k^T) @ v of each sequence's queries [B, Hq, Lq, key_dim] against its keys and values in the cache (layer `layer`); key_limits int64 [B, Lq] (query i sees keys [limit - window, limit)) or None for the causal bound of the sequence's newest Lq tokens. See ember/attention.h.
    """

def avg_pool2d(
    x: ember._tensor.DLPackTensor,
    kernel: typing.Annotated[collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], "FixedSize(2)"],
    stride: typing.Annotated[collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], "FixedSize(2)"],
    padding: typing.Annotated[collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], "FixedSize(2)"],
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: typing.SupportsInt | typing.SupportsIndex,
    out: ember._tensor.DLPackTensor,
) -> None:
    """
    out = avg_pool2d(x) over a channels-last [N, C, H, W] x (channels of stride 1), torch's divisors (divisor_override 0 for none); float32 or bfloat16. See ember/pool.h.
    """

def bf16_implementation(op: str) -> str: ...
def bf16_join(
    top: ember._tensor.DLPackTensor, bottom: ember._tensor.DLPackTensor, out: ember._tensor.DLPackTensor
) -> None: ...
def bf16_round(x: ember._tensor.DLPackTensor, out: ember._tensor.DLPackTensor) -> None: ...
def bf16_split(
    x: ember._tensor.DLPackTensor, top: ember._tensor.DLPackTensor, bottom: ember._tensor.DLPackTensor
) -> None: ...
def build_info() -> dict[str, typing.Any]: ...
def convert_tensors(*args: ember._tensor.DLPackTensor) -> int: ...
def cpu_features() -> dict[str, typing.Any]: ...
def describe_tensor(obj: ember._tensor.DLPackTensor) -> tuple[str, tuple[int, ...], tuple[int, ...], int, bool]: ...
def detected_isa() -> str: ...
def dropout(
    x: ember._tensor.DLPackTensor,
    out: ember._tensor.DLPackTensor,
    p: typing.SupportsFloat | typing.SupportsIndex,
    seed: typing.SupportsInt | typing.SupportsIndex,
) -> None: ...
def dropout_implementation() -> str: ...
def embedding_bag_implementation() -> str: ...
def frozen_batch_norm(
    x: ember._tensor.DLPackTensor,
    weight: ember._tensor.DLPackTensor,
    bias: ember._tensor.DLPackTensor,
    running_mean: ember._tensor.DLPackTensor,
    running_var: ember._tensor.DLPackTensor,
    eps: typing.SupportsFloat | typing.SupportsIndex,
    out: ember._tensor.DLPackTensor,
    relu: bool = False,
) -> None: ...
def frozen_batch_norm_backward(
    grad_y: ember._tensor.DLPackTensor,
    weight: ember._tensor.DLPackTensor,
    running_var: ember._tensor.DLPackTensor,
    eps: typing.SupportsFloat | typing.SupportsIndex,
    grad_x: ember._tensor.DLPackTensor,
) -> None: ...
def frozen_batch_norm_implementation() -> str: ...
def interaction_backward(
    inputs: collections.abc.Sequence[ember._tensor.DLPackTensor],
    grad_out: ember._tensor.DLPackTensor,
    grad_inputs: collections.abc.Sequence[ember._tensor.DLPackTensor],
) -> None: ...
def interaction_forward(
    inputs: collections.abc.Sequence[ember._tensor.DLPackTensor], out: ember._tensor.DLPackTensor
) -> None: ...
def interaction_implementation() -> str: ...
def interaction_output_width(
    inputs: typing.SupportsInt | typing.SupportsIndex, dim: typing.SupportsInt | typing.SupportsIndex
) -> int: ...
def isa_levels() -> list[str]: ...
def lamb_step(
    params: collections.abc.Sequence[ember._tensor.DLPackTensor],
    grads: collections.abc.Sequence[ember._tensor.DLPackTensor],
    exp_avgs: collections.abc.Sequence[ember._tensor.DLPackTensor],
    exp_avg_sqs: collections.abc.Sequence[ember._tensor.DLPackTensor],
    steps: collections.abc.Sequence[ember._tensor.DLPackTensor],
    options: LambOptions,
    *,
    grad_scale: ember._tensor.DLPackTensor | None = None,
    found_inf: ember._tensor.DLPackTensor | None = None,
    bottoms: collections.abc.Sequence[ember._tensor.DLPackTensor | None] = (),
) -> None: ...
def lars_step(
    params: collections.abc.Sequence[ember._tensor.DLPackTensor],
    grads: collections.abc.Sequence[ember._tensor.DLPackTensor],
    momentum_buffers: collections.abc.Sequence[ember._tensor.DLPackTensor],
    first_step: collections.abc.Sequence[bool],
    options: LarsOptions,
    *,
    grad_scale: ember._tensor.DLPackTensor | None = None,
    found_inf: ember._tensor.DLPackTensor | None = None,
    bottoms: collections.abc.Sequence[ember._tensor.DLPackTensor | None] = (),
) -> None: ...
def last_level_cache_bytes() -> int: ...
def max_isa() -> str: ...
def max_pool2d(
    x: ember._tensor.DLPackTensor,
    kernel: typing.Annotated[collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], "FixedSize(2)"],
    stride: typing.Annotated[collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], "FixedSize(2)"],
    padding: typing.Annotated[collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], "FixedSize(2)"],
    dilation: typing.Annotated[collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], "FixedSize(2)"],
    ceil_mode: bool,
    relu: bool,
    out: ember._tensor.DLPackTensor,
) -> None:
    """
    out = max_pool2d(x) over a channels-last [N, C, H, W] x (channels of stride 1), then max(out, 0) with relu (NaN kept); float32 or bfloat16. See ember/pool.h.
    """

def max_pool2d_implementation() -> str: ...
def merged_embedding_bag_adagrad_update(
    weights: collections.abc.Sequence[ember._tensor.DLPackTensor],
    indices: collections.abc.Sequence[ember._tensor.DLPackTensor],
    offsets: collections.abc.Sequence[ember._tensor.DLPackTensor],
    per_sample_weights: collections.abc.Sequence[ember._tensor.DLPackTensor | None],
    grads: collections.abc.Sequence[ember._tensor.DLPackTensor],
    bottoms: collections.abc.Sequence[ember._tensor.DLPackTensor | None],
    state_sums: collections.abc.Sequence[ember._tensor.DLPackTensor | None],
    steps: collections.abc.Sequence[ember._tensor.DLPackTensor | None],
    *,
    mode: str,
    include_last_offset: bool,
    lr: typing.SupportsFloat | typing.SupportsIndex,
    lr_decay: typing.SupportsFloat | typing.SupportsIndex,
    weight_decay: typing.SupportsFloat | typing.SupportsIndex,
    eps: typing.SupportsFloat | typing.SupportsIndex,
) -> None: ...
def merged_embedding_bag_backward(
    weights: collections.abc.Sequence[ember._tensor.DLPackTensor],
    indices: collections.abc.Sequence[ember._tensor.DLPackTensor],
    offsets: collections.abc.Sequence[ember._tensor.DLPackTensor],
    per_sample_weights: collections.abc.Sequence[ember._tensor.DLPackTensor | None],
    grads: collections.abc.Sequence[ember._tensor.DLPackTensor],
    *,
    mode: str,
    include_last_offset: bool,
) -> list[tuple[typing_extensions.CapsuleType, typing_extensions.CapsuleType]]:
    """
    Per table, (rows, values): the rows the bags touched, ascending, and their gradients (float32, float64 for a float64 table), as DLPack capsules.
    """

def merged_embedding_bag_forward(
    weights: collections.abc.Sequence[ember._tensor.DLPackTensor],
    indices: collections.abc.Sequence[ember._tensor.DLPackTensor],
    offsets: collections.abc.Sequence[ember._tensor.DLPackTensor],
    per_sample_weights: collections.abc.Sequence[ember._tensor.DLPackTensor | None],
    out: collections.abc.Sequence[ember._tensor.DLPackTensor],
    *,
    mode: str,
    include_last_offset: bool,
) -> None: ...
def merged_embedding_bag_per_sample_weights_backward(
    weights: collections.abc.Sequence[ember._tensor.DLPackTensor],
    indices: collections.abc.Sequence[ember._tensor.DLPackTensor],
    offsets: collections.abc.Sequence[ember._tensor.DLPackTensor],
    per_sample_weights: collections.abc.Sequence[ember._tensor.DLPackTensor | None],
    grads: collections.abc.Sequence[ember._tensor.DLPackTensor],
    grad_per_sample_weights: collections.abc.Sequence[ember._tensor.DLPackTensor | None],
    *,
    mode: str,
    include_last_offset: bool,
) -> None: ...
def merged_embedding_bag_sgd_update(
    weights: collections.abc.Sequence[ember._tensor.DLPackTensor],
    indices: collections.abc.Sequence[ember._tensor.DLPackTensor],
    offsets: collections.abc.Sequence[ember._tensor.DLPackTensor],
    per_sample_weights: collections.abc.Sequence[ember._tensor.DLPackTensor | None],
    grads: collections.abc.Sequence[ember._tensor.DLPackTensor],
    bottoms: collections.abc.Sequence[ember._tensor.DLPackTensor | None],
    *,
    mode: str,
    include_last_offset: bool,
    lr: typing.SupportsFloat | typing.SupportsIndex,
    weight_decay: typing.SupportsFloat | typing.SupportsIndex,
) -> None: ...
def multiply(
    x: ember._tensor.DLPackTensor, factor: ember._tensor.DLPackTensor, out: ember._tensor.DLPackTensor
) -> None:
    """
    out = x * factor elementwise, factor of x's sizes at any strides (a broadcast view); float32 or bfloat16, each product rounded once. See ember/epilogue.h.
    """

def nms(
    boxes: ember._tensor.DLPackTensor,
    scores: ember._tensor.DLPackTensor,
    iou_threshold: typing.SupportsFloat | typing.SupportsIndex,
) -> typing_extensions.CapsuleType:
    """
    The kept indices, in decreasing score, as a DLPack capsule of int64.
    """

def nms_implementation() -> str: ...
def num_threads() -> int: ...
def onednn_info() -> dict[str, typing.Any]: ...
def openmp_available() -> bool: ...
def pin_thread(cpus: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> ThreadPin: ...
def pinned_cpus() -> list[int]: ...
def process_cpus() -> list[int]: ...
def roi_align_backward(
    grad_out: ember._tensor.DLPackTensor,
    rois: ember._tensor.DLPackTensor,
    grad_input: ember._tensor.DLPackTensor,
    *,
    spatial_scale: typing.SupportsFloat | typing.SupportsIndex,
    pooled_height: typing.SupportsInt | typing.SupportsIndex,
    pooled_width: typing.SupportsInt | typing.SupportsIndex,
    sampling_ratio: typing.SupportsInt | typing.SupportsIndex,
    aligned: bool,
) -> None: ...
def roi_align_forward(
    input: ember._tensor.DLPackTensor,
    rois: ember._tensor.DLPackTensor,
    out: ember._tensor.DLPackTensor,
    *,
    spatial_scale: typing.SupportsFloat | typing.SupportsIndex,
    pooled_height: typing.SupportsInt | typing.SupportsIndex,
    pooled_width: typing.SupportsInt | typing.SupportsIndex,
    sampling_ratio: typing.SupportsInt | typing.SupportsIndex,
    aligned: bool,
) -> None: ...
def roi_align_implementation() -> str: ...
def rotary_embedding(
    x: ember._tensor.DLPackTensor,
    cos: ember._tensor.DLPackTensor,
    sin: ember._tensor.DLPackTensor,
    out: ember._tensor.DLPackTensor,
) -> None:
    """
    out = x * cos + rotate_half(x) * sin over [batch, heads, length, features] x (features even), cos and sin broadcasting to it; float32 or bfloat16. See ember/rope.h.
    """

def rotary_embedding_implementation() -> str: ...
def row_norm(
    kind: str,
    x: ember._tensor.DLPackTensor,
    residual: ember._tensor.DLPackTensor | None,
    weight: ember._tensor.DLPackTensor | None,
    bias: ember._tensor.DLPackTensor | None,
    eps: typing.SupportsFloat | typing.SupportsIndex,
    out: ember._tensor.DLPackTensor,
    sum_out: ember._tensor.DLPackTensor | None = None,
    out_bf16: ember._tensor.DLPackTensor | None = None,
) -> None:
    """
    out = norm(h) * weight + bias over the last dimension, h = x + residual (written to sum_out when given) or x; out_bf16, for a float32 out: the result rounded to bfloat16 too; kind 'layer' (LayerNorm) or 'rms' (RMSNorm, no bias). See ember/norm.h.
    """

def row_norm_implementation() -> str: ...
def scaled_dot_product_attention(
    q: ember._tensor.DLPackTensor,
    k: ember._tensor.DLPackTensor,
    v: ember._tensor.DLPackTensor,
    mask: ember._tensor.DLPackTensor | None,
    causal: bool,
    scale: typing.SupportsFloat | typing.SupportsIndex,
    out: ember._tensor.DLPackTensor,
    softcap: typing.SupportsFloat | typing.SupportsIndex = 0.0,
) -> None:
    """
    out = softmax(scale * q @ k^T + mask) @ v over [batch, heads, length, features] operands, float32 or bfloat16; softcap > 0 caps each scaled score at softcap * tanh(score / softcap) before the mask; mask float (added) or bool (True keeps), broadcasting; causal masks keys after each query; key/value heads shared by groups of query heads. See ember/attention.h.
    """

def set_max_isa(isa: str) -> None: ...
def set_num_threads(n: typing.SupportsInt | typing.SupportsIndex) -> None: ...
def set_stream_threshold_bytes(bytes: typing.SupportsInt | typing.SupportsIndex) -> None: ...
def set_thread_affinity(cpus: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None: ...
def set_threading_backend(backend: str) -> None: ...
def set_verbose(on: bool) -> None: ...
def sgd_step(
    params: collections.abc.Sequence[ember._tensor.DLPackTensor],
    grads: collections.abc.Sequence[ember._tensor.DLPackTensor],
    momentum_buffers: collections.abc.Sequence[ember._tensor.DLPackTensor],
    first_step: collections.abc.Sequence[bool],
    options: SgdOptions,
    *,
    grad_scale: ember._tensor.DLPackTensor | None = None,
    found_inf: ember._tensor.DLPackTensor | None = None,
    bottoms: collections.abc.Sequence[ember._tensor.DLPackTensor | None] = (),
) -> None: ...
def stream_threshold_bytes() -> int: ...
def tbb_version() -> str: ...
def team_affinity(threads: typing.SupportsInt | typing.SupportsIndex) -> list[list[int]]: ...
def thread_affinity() -> list[int]: ...
def threading_backend() -> str: ...
def unpin_thread(pin: ThreadPin) -> None: ...
def verbose() -> bool: ...
