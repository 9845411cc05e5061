"""The per-call fast path of graph mode's fused layers: what a forward checks once for the whole graph, and each
node's call, reduced to allocating its output and calling its kernel.

A fused node's general call (:class:`~ember._optimize.graph.nodes.FusedLayer`) decides everything afresh: whether
autograd, a trace or the profiler needs torch's operations, whether the layer's tensors are still those its kernel
was built from, the plan for the input's signature, the compute dtype and layout, the thread budget. Each decision is
cheap, but there are dozens of them per node, and between two kernels the interpreter runs with caches the kernels
have just filled with activations and weights: ResNet-50 at batch 1 in bf16 spent 40-50 us of Python per
convolution on the 2-core Zen 5 (a tenth of its time), where a loop over one node measures 12-17 us.

So the checks that hold for a whole forward move to its start (:class:`GraphGuard`, once per call of the graph):
autograd off, no trace, profiler or dispatch mode, the thread budget synced, and every fused layer's tensors
compared with those its kernel was built from (a changed or replaced tensor drops the kernel and its fast call, as
it always did, and the general call rebuilds them), each layer marked with the guard's pass. Inside that forward
each layer so marked whose last kernel call had inputs like this one's (:class:`FastLinear`, :class:`FastConv`: the
same shape, dtype and layout, an operand of the same kind, the same autocast state) allocates the output and calls
the kernel; anything else takes the general call.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Iterable
from typing import Any, cast

import torch
from torch import fx

from ember import _C
from ember._compat import interposed_dispatch, is_compiling
from ember._optimize.inference import conv, linear
from ember._optimize.inference.common import cpu_autocast_enabled, in_compute_dtype, is_dense
from ember._optimize.inference.state import CachedKernel, CallPlan, LayerState, TensorRef
from ember._tensor import dlpack, sync_threads


class _Checked(threading.local):
    """The pass of the guard whose forward the calling thread runs (0 outside one, or where it did not pass): a layer
    takes its fast call only where this very pass checked it (``CachedKernel.checked``), so a layer reached some
    other way (another graph's, called inside this forward) never skips a check it did not have."""

    epoch = 0


CHECKED = _Checked()


class _Recording(threading.local):
    """The recorder (replay.Recorder) of the segment whose recording forward the calling thread runs, or None: each
    fast call reports its kernel call to it."""

    active: Any = None


RECORDING = _Recording()
_EPOCHS = itertools.count(1)
_MISSING = object()


class GraphGuard:
    """The checks a graph's forward makes once, for every fused layer in it."""

    def __init__(self, states: Iterable[LayerState]) -> None:
        self.layers = tuple((state, state.refs()) for state in states)
        self._marks: _C.TensorMarks | None = None

    def passes(self) -> int:
        """This pass's number (nonzero) where the call may take the layers' fast calls, each layer marked with it;
        else 0. Tracks the layers' tensors on the way (a layer whose tensors changed drops its kernel, its plans
        and its fast call)."""
        if torch.is_grad_enabled() or interposed_dispatch() or is_compiling():
            return 0
        sync_threads()
        epoch = next(_EPOCHS)
        marks = self._marks
        if marks is None:
            marks = self._marks = self._layer_marks()
        # One C++ call compares every layer's tensors with the marks it copied and marks the unchanged layers; the
        # others (a tensor changed, or a layer's cache marked anything since) take the comparison here, which
        # decides, and the copy is made again from what the caches hold then.
        changed = marks.check(epoch)
        for i in changed:
            state, refs = self.layers[i]
            cache = state.cache
            if not _unchanged(cache, refs):
                cache.track(state.tensors())  # the state's own reading decides, and drops what changed
            cache.checked = epoch
        if changed:
            self._marks = None
        return epoch

    def _layer_marks(self) -> _C.TensorMarks:
        marks = _C.TensorMarks()
        for state, refs in self.layers:
            marks.add(state.cache, list(refs))
        return marks


def _unchanged(cache: CachedKernel, refs: tuple[TensorRef | None, ...]) -> bool:
    """CachedKernel.track's comparison, reading each tensor where its ref says, in one frame: the guard's own for a
    layer that its C++ check (``_C.TensorMarks``) did not pass."""
    marks = cache.marks
    if len(marks) != len(refs):
        return False
    for mark, ref in zip(marks, refs):
        t = None if ref is None else ref.owner._parameters.get(ref.name, _MISSING)
        if t is _MISSING:
            t = ref.get()  # type: ignore[union-attr]
        if mark is None or t is None:
            if mark is not None or t is not None:
                return False
            continue
        if mark[0]() is not t or mark[2] != t.data_ptr() or (mark[1] >= 0 and mark[1] != t._version):
            return False
    return True


class checked:
    """``with checked(guard):`` runs the body with the fast calls of the layers ``guard`` checked on (where it passes),
    and restores the calling thread's previous state after it (a graph can run inside another's forward)."""

    __slots__ = ("epoch", "previous")

    def __init__(self, guard: GraphGuard) -> None:
        self.epoch = guard.passes()
        self.previous = 0

    def __enter__(self) -> None:
        self.previous = CHECKED.epoch
        CHECKED.epoch = self.epoch

    def __exit__(self, *exc: object) -> None:
        CHECKED.epoch = self.previous


def bind_called_modules(gm: fx.GraphModule) -> None:
    """Puts each module the graph calls into the GraphModule's instance dict as well as its registry: the generated
    code's ``self.<name>`` then finds it at once, where nn.Module.__getattr__ (reached after the normal lookup fails)
    costs a Python call per node. Assigning a module to the name later goes through nn.Module.__setattr__, which
    drops the instance entry first, so the two never disagree."""
    for node in gm.graph.nodes:
        if node.op == "call_module" and "." not in node.target:
            module = gm._modules.get(node.target)
            if module is not None:
                gm.__dict__[node.target] = module


def _plan_of(key: Any, x: torch.Tensor, operand: Any, state: LayerState) -> CallPlan | None:
    """The plan the layer's kernel (not torch) has just followed for ``x`` (a CPU tensor, of signature ``key`` as the
    layer's run names it) with a tensor operand or none; None otherwise."""
    if state.cache.kernel is None or not x.is_cpu or not (operand is None or isinstance(operand, torch.Tensor)):
        return None
    plan = state.cache.plans.get(key)
    return None if plan is None or plan.torch else plan


class _FastCall:
    """What both fast calls check and do: the input's shape, dtype and device, its conversion to the compute dtype
    (common.in_compute_dtype's, when the plan converts), and whether autograd or autocast wants torch's call."""

    __slots__ = ("autocast", "compute", "convert", "dtype", "entries", "kernel",
                 "out_dtype", "out_shape", "out_strides", "shape")  # fmt: skip

    def __init__(self, x: torch.Tensor, out: torch.Tensor, state: LayerState, plan: CallPlan, entries: tuple[str, ...]):
        self.shape, self.dtype = x.shape, x.dtype
        self.compute, self.convert = state.compute, plan.convert
        # An fp32 layer under autocast leaves its call to torch, unless its input is converted (defers_to_autocast).
        self.autocast = not plan.convert and state.compute == torch.float32
        self.out_shape, self.out_strides, self.out_dtype = out.shape, out.stride(), out.dtype
        self.kernel = state.cache.kernel
        self.entries = entries

    def takes(self, x: torch.Tensor) -> bool:
        if x.shape != self.shape or x.dtype != self.dtype or not x.is_cpu or torch.is_grad_enabled():
            return False
        return not (self.autocast and cpu_autocast_enabled())

    def converted(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` in the compute dtype, as the general call converts it (before any change of layout)."""
        if not self.convert:
            return x
        converted = cast(torch.Tensor, in_compute_dtype(x, True, self.compute))  # (None only for one not converted)
        recorder = RECORDING.active
        if recorder is not None and converted is not x and self.compute == torch.bfloat16 and is_dense(x):
            recorder.round_bf16(x, converted)  # (ember's rounding: in_compute_dtype's for a dense x)
        return converted


class FastLinear(_FastCall):
    """A fused Linear's call for inputs like the last one its kernel ran: contiguous (or 2-D rows the kernel reads
    where they lie, at the recorded strides: a token selected from each sequence of a batch, ViT's classifier input),
    of one shape and dtype, and an operand (residual or factor) of one dtype and of the output's shape (contiguous, or
    copied first at the strides it had), or none."""

    __slots__ = ("operand_dtype", "operand_reshaped", "operand_strides", "rows_strides", "transposed", "weight")

    def __init__(self, x: torch.Tensor, operand: torch.Tensor | None, out: torch.Tensor, state: LayerState,
                 plan: CallPlan, entries: tuple[str, ...]) -> None:  # fmt: skip
        super().__init__(x, out, state, plan, entries)
        self.operand_dtype = None if operand is None else operand.dtype
        # The weight a kernel reads in place, weakly: the guard drops this call when the parameter is replaced.
        self.weight = weakref.ref(cast(torch.Tensor, state.tensors()[0])) if plan.in_place else None
        self.transposed = state.transposed
        # The graph reshaped the output before adding the operand (Hugging Face's Conv1D): the operand is read in the
        # layer's rows, as the general call reads it (FusedLayer.operand_reshaped).
        self.operand_reshaped = False
        # The strides of a non-contiguous input whose rows the kernel read where they lie; None: contiguous inputs.
        self.rows_strides = None if x.is_contiguous() else x.stride()
        # The strides of a non-contiguous operand, which the call copies first, as the general call does (Whisper's
        # first encoder layer adds its permuted frames); None: a contiguous operand, or none.
        self.operand_strides = None if operand is None or operand.is_contiguous() else operand.stride()

    @staticmethod
    def of(x: torch.Tensor, operand: Any, out: torch.Tensor, state: LayerState, entries: tuple[str, ...],
           operand_reshaped: bool) -> FastLinear | None:  # fmt: skip
        """The fast call for inputs like ``x`` and ``operand`` (as the kernel read it: in the layer's rows where
        ``operand_reshaped``), which the kernel has just run into ``out``; None for those it does not take (a layout
        the kernel needed copied, a 1-D input)."""
        plan = _plan_of(linear.signature(x), x, operand, state)
        if plan is None or x.dim() < 2 or not (x.is_contiguous() or linear.rows_apart(x)):
            return None
        fast = FastLinear(x, operand, out, state, plan, entries)
        fast.operand_reshaped = operand_reshaped and operand is not None
        return fast

    def __call__(self, x: torch.Tensor, operand: torch.Tensor | None) -> torch.Tensor | None:
        if not self.takes(x):
            return None
        if not (x.is_contiguous() if self.rows_strides is None else x.stride() == self.rows_strides):
            return None
        if operand is None:
            if self.operand_dtype is not None:
                return None
            res = None
        else:
            if self.operand_reshaped:
                operand = operand.reshape(*x.shape[:-1], operand.shape[-1])
            if operand.dtype != self.operand_dtype or operand.shape != self.out_shape:
                return None
            if not operand.is_contiguous():
                if operand.stride() != self.operand_strides:
                    return None
                copied = operand.contiguous()
                if RECORDING.active is not None:
                    RECORDING.active.moved(operand, copied)
                operand = copied
            res = dlpack(operand)
        weight = None
        if self.weight is not None:
            w = self.weight()
            if w is None:
                return None
            weight = w.t() if self.transposed else w
        x = self.converted(x)
        out = x.new_empty_strided(self.out_shape, self.out_strides, dtype=self.out_dtype)
        self.kernel.forward(dlpack(x), None if weight is None else dlpack(weight), dlpack(out), self.entries, res)
        recorder = RECORDING.active
        if recorder is not None:
            recorder.linear(self.kernel, x, weight, out, self.entries, operand)
        return out


class FastConv(_FastCall):
    """A fused convolution's call for inputs like the last one its kernel ran: 2-D or 3-D, channels-last or contiguous
    (laid out channels-last, as the general call does), of one shape and dtype, and an operand of the output's shape
    and dtype, or none. ``in_place``: the epilogue starts with the residual add and the graph reads the operand
    nowhere after the call, so an operand laid out as the output takes the output (the kernel adds in place)."""

    __slots__ = ("format", "in_place", "operand")

    def __init__(self, x: torch.Tensor, operand: torch.Tensor | None, out: torch.Tensor, state: LayerState,
                 plan: CallPlan, entries: tuple[str, ...], in_place: bool = False) -> None:  # fmt: skip
        super().__init__(x, out, state, plan, entries)
        self.format = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
        self.operand = operand is not None
        self.in_place = in_place and operand is not None

    @staticmethod
    def of(x: torch.Tensor, operand: Any, out: torch.Tensor, state: LayerState, entries: tuple[str, ...],
           padded: bool, in_place: bool = False) -> FastConv | None:  # fmt: skip
        """As :meth:`FastLinear.of`; ``padded``: a padding mode other than zeros, applied before the kernel (not
        taken); ``in_place``: see the class."""
        plan = _plan_of(conv.signature(x), x, operand, state) if x.dim() in (4, 5) and not padded else None
        if plan is None:
            return None
        fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
        if not (x.is_contiguous(memory_format=fmt) or x.is_contiguous()):
            return None
        return FastConv(x, operand, out, state, plan, entries, in_place)

    def __call__(self, x: torch.Tensor, operand: torch.Tensor | None) -> torch.Tensor | None:
        if not self.takes(x):
            return None
        if operand is None:
            if self.operand:
                return None
            res = None
        else:
            if not self.operand or operand.dtype != self.out_dtype or operand.shape != self.out_shape:
                return None
            res = dlpack(operand)
        x = self.converted(x)
        if not x.is_contiguous(memory_format=self.format):
            if not x.is_contiguous():
                return None
            laid_out = x.contiguous(memory_format=self.format)  # the model's input, as conv._layout lays it out
            if RECORDING.active is not None:
                RECORDING.active.moved(x, laid_out)
            x = laid_out
        if (
            self.in_place
            and operand is not None
            and operand.stride() == self.out_strides
            and operand.data_ptr() != x.data_ptr()
        ):
            out = operand  # (checked above: the output's dtype and shape)
        else:
            out = x.new_empty_strided(self.out_shape, self.out_strides, dtype=self.out_dtype)
        self.kernel.forward(dlpack(x), dlpack(out), self.entries, res)
        recorder = RECORDING.active
        if recorder is not None:
            recorder.convolution(self.kernel, x, out, self.entries, operand)
        return out
