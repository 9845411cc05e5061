"""Type stubs for ember._C, the pybind11 binding of ember's C++ core.

Tensor arguments accept a DLPack capsule (torch.utils.dlpack.to_dlpack(t)) or any object with __dlpack__
(torch tensors, numpy arrays); the binding borrows their memory for the duration of the call.
"""

from collections.abc import Sequence
from typing import Any

# --- bf16 conversion (outputs are allocated by the caller)
def bf16_split(x: Any, top: Any, bottom: Any) -> None: ...
def bf16_join(top: Any, bottom: Any, out: Any) -> None: ...
def bf16_round(x: Any, out: Any) -> None: ...
def bf16_implementation(op: str) -> str: ...

# --- dropout (see ember/nn/dropout.py): out is a new tensor of x's dtype and strides, or x itself.
def dropout(x: Any, out: Any, p: float, seed: int) -> None: ...
def dropout_implementation() -> str: ...

# --- merged embedding bags (see ember/nn/embedding_bag.py): one entry per table in every list; None in
# per_sample_weights / bottoms / grad_per_sample_weights for a table without. mode: "sum" or "mean".
def embedding_bag_implementation() -> str: ...
def merged_embedding_bag_forward(
    weights: Sequence[Any],
    indices: Sequence[Any],
    offsets: Sequence[Any],
    per_sample_weights: Sequence[Any | None],
    out: Sequence[Any],
    *,
    mode: str,
    include_last_offset: bool,
) -> None: ...
def merged_embedding_bag_backward(
    weights: Sequence[Any],
    indices: Sequence[Any],
    offsets: Sequence[Any],
    per_sample_weights: Sequence[Any | None],
    grads: Sequence[Any],
    *,
    mode: str,
    include_last_offset: bool,
) -> list[tuple[Any, Any]]: ...  # per table (rows, values) as DLPack capsules; values float32 (float64 tables: float64)
def merged_embedding_bag_per_sample_weights_backward(
    weights: Sequence[Any],
    indices: Sequence[Any],
    offsets: Sequence[Any],
    per_sample_weights: Sequence[Any | None],
    grads: Sequence[Any],
    grad_per_sample_weights: Sequence[Any | None],
    *,
    mode: str,
    include_last_offset: bool,
) -> None: ...
def merged_embedding_bag_sgd_update(
    weights: Sequence[Any],
    indices: Sequence[Any],
    offsets: Sequence[Any],
    per_sample_weights: Sequence[Any | None],
    grads: Sequence[Any],
    bottoms: Sequence[Any | None],
    *,
    mode: str,
    include_last_offset: bool,
    lr: float,
    weight_decay: float,
) -> None: ...
def merged_embedding_bag_adagrad_update(
    weights: Sequence[Any],
    indices: Sequence[Any],
    offsets: Sequence[Any],
    per_sample_weights: Sequence[Any | None],
    grads: Sequence[Any],
    bottoms: Sequence[Any | None],
    state_sums: Sequence[Any],
    steps: Sequence[Any],
    *,
    mode: str,
    include_last_offset: bool,
    lr: float,
    lr_decay: float,
    weight_decay: float,
    eps: float,
) -> None: ...

# --- DLRM's dot interaction (see ember/nn/interaction.py): inputs[0] is the dense features.
def interaction_implementation() -> str: ...
def interaction_output_width(inputs: int, dim: int) -> int: ...
def interaction_forward(inputs: Sequence[Any], out: Any) -> None: ...
def interaction_backward(inputs: Sequence[Any], grad_out: Any, grad_inputs: Sequence[Any]) -> None: ...

# --- frozen batch norm (see ember/nn/frozen_batch_norm.py): buffers [C] float32 (float64 for float64 x); out float32
# or x's dtype.
def frozen_batch_norm_implementation() -> str: ...
def frozen_batch_norm(
    x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any, eps: float, out: Any
) -> None: ...
def frozen_batch_norm_backward(grad_y: Any, weight: Any, running_var: Any, eps: float, grad_x: Any) -> None: ...

# --- detection ops (see ember/nn/vision.py): nms returns the kept indices as a DLPack capsule of int64.
def nms_implementation() -> str: ...
def nms(boxes: Any, scores: Any, iou_threshold: float) -> Any: ...
def roi_align_implementation() -> str: ...
def roi_align_forward(
    input: Any,  # noqa: A002 - the binding's keyword
    rois: Any,
    out: Any,
    *,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
    aligned: bool,
) -> None: ...
def roi_align_backward(
    grad_out: Any,
    rois: Any,
    grad_input: Any,
    *,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
    aligned: bool,
) -> None: ...

# --- fused optimizer steps (one call per param group; see ember/optim). bottoms: empty, or per parameter the
# int16 bottom half of a split-BF16 parameter (whose params entry is then its bf16 top half) or None.
def adam_step(
    params: Sequence[Any],
    grads: Sequence[Any],
    exp_avgs: Sequence[Any],
    exp_avg_sqs: Sequence[Any],
    max_exp_avg_sqs: Sequence[Any],
    steps: Sequence[Any],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    decoupled_weight_decay: bool,
    amsgrad: bool,
    maximize: bool,
    grad_scale: Any | None = None,
    found_inf: Any | None = None,
    bottoms: Sequence[Any | None] = (),
) -> None: ...
def adagrad_step(
    params: Sequence[Any],
    grads: Sequence[Any],
    state_sums: Sequence[Any],
    steps: Sequence[Any],
    *,
    lr: float,
    lr_decay: float,
    weight_decay: float,
    eps: float,
    maximize: bool,
    grad_scale: Any | None = None,
    found_inf: Any | None = None,
    bottoms: Sequence[Any | None] = (),
) -> None: ...
def lamb_step(
    params: Sequence[Any],
    grads: Sequence[Any],
    exp_avgs: Sequence[Any],
    exp_avg_sqs: Sequence[Any],
    steps: Sequence[Any],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    bias_correction: bool,
    maximize: bool,
    grad_scale: Any | None = None,
    found_inf: Any | None = None,
    bottoms: Sequence[Any | None] = (),
) -> None: ...
def lars_step(
    params: Sequence[Any],
    grads: Sequence[Any],
    momentum_buffers: Sequence[Any],
    first_step: Sequence[bool],
    *,
    lr: float,
    momentum: float,
    dampening: float,
    weight_decay: float,
    nesterov: bool,
    trust_coefficient: float,
    eps: float,
    maximize: bool,
    grad_scale: Any | None = None,
    found_inf: Any | None = None,
    bottoms: Sequence[Any | None] = (),
) -> None: ...
def sgd_step(
    params: Sequence[Any],
    grads: Sequence[Any],
    momentum_buffers: Sequence[Any],
    first_step: Sequence[bool],
    *,
    lr: float,
    momentum: float,
    dampening: float,
    weight_decay: float,
    nesterov: bool,
    maximize: bool,
    grad_scale: Any | None = None,
    found_inf: Any | None = None,
    bottoms: Sequence[Any | None] = (),
) -> None: ...

# --- exception translation (for tests)
def _raise_error(kind: str, message: str) -> None:
    """Raises the C++ exception `kind` (type, value, index, runtime, dnnl) so tests can check its translation.

    A dnnl::error carries a fixed message: oneDNN's exception keeps a pointer to a literal, not a copy."""

# --- the DLPack boundary
def describe_tensor(obj: Any) -> tuple[str, tuple[int, ...], tuple[int, ...], int, bool]:
    """(dtype name, sizes, strides in elements, data address, is contiguous) of a DLPack object."""

def convert_tensors(*args: Any) -> int:
    """Converts every argument to a TensorView and drops it; returns how many (for benchmarks)."""

# --- CPU features and ISA dispatch
def cpu_features() -> dict[str, Any]: ...
def detected_isa() -> str: ...
def active_isa() -> str: ...
def max_isa() -> str: ...
def set_max_isa(isa: str) -> None: ...
def isa_levels() -> list[str]: ...
def verbose() -> bool: ...
def set_verbose(on: bool) -> None: ...

# --- threading
def num_threads() -> int: ...
def set_num_threads(n: int) -> None: ...
def threading_backend() -> str: ...
def set_threading_backend(backend: str) -> None: ...
def openmp_available() -> bool: ...

class ThreadPin:
    @property
    def cpus(self) -> list[int]: ...

def thread_affinity() -> list[int]: ...
def set_thread_affinity(cpus: list[int]) -> None: ...
def team_affinity(threads: int) -> list[list[int]]: ...
def pin_thread(cpus: list[int]) -> ThreadPin: ...
def unpin_thread(pin: ThreadPin) -> None: ...
def pinned_cpus() -> list[int]: ...

# --- streaming stores
def last_level_cache_bytes() -> int: ...
def stream_threshold_bytes() -> int: ...
def set_stream_threshold_bytes(bytes: int) -> None: ...  # noqa: A002 - the binding's keyword

# --- configuration
def build_info() -> dict[str, Any]: ...
def onednn_info() -> dict[str, str]: ...
def tbb_version() -> str: ...

# oneDNN layers (python/csrc/onednn_binding.cpp): caches of reordered weights beside torch's parameters.
class Linear:
    def __init__(
        self, weight: Any, bias: Any | None, compute: str, prepack: bool = True, rows_hint: int = 64
    ) -> None: ...
    @staticmethod
    def supported(compute: str) -> bool: ...
    @staticmethod
    def skinny_rows(compute: str) -> int: ...
    def forward(
        self, x: Any, weight: Any | None, out: Any, epilogue: list[str] = ..., residual: Any | None = None
    ) -> None: ...
    @property
    def out_features(self) -> int: ...
    @property
    def in_features(self) -> int: ...
    @property
    def compute(self) -> str: ...
    @property
    def prepack(self) -> bool: ...
    def packed_bytes(self) -> int: ...
    def cached_primitives(self) -> int: ...
    def implementation(self, m: int, weight: Any | None = None) -> str: ...

class Convolution:
    def __init__(
        self,
        weight: Any,
        bias: Any | None,
        stride: list[int],
        padding_l: list[int],
        padding_r: list[int],
        dilation: list[int],
        groups: int,
        transposed: bool,
        compute: str,
        input_hint: Any,
    ) -> None: ...
    @staticmethod
    def supported(compute: str) -> bool: ...
    def forward(self, x: Any, out: Any, epilogue: list[str] = ..., residual: Any | None = None) -> None: ...
    def output_shape(self, input_shape: list[int]) -> list[int]: ...
    @property
    def in_channels(self) -> int: ...
    @property
    def out_channels(self) -> int: ...
    @property
    def compute(self) -> str: ...
    def packed_bytes(self) -> int: ...
    def cached_primitives(self) -> int: ...
    def implementation(self, x: Any) -> str: ...
