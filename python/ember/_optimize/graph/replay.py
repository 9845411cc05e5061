"""A run of fused nodes replayed in one call: the kernel calls one forward of a graph segment made, recorded once per
input signature and run again from C++ (``ember._C.Replay``) with no Python between them.

Inside a transformer's forward at batch 1 the kernels are short: on the 16-core Xeon BERT-base's 85 kernel calls
take 12-13 ms of a 19 ms forward, and the rest is the interpreter and torch's dispatcher running cold between them
(30-50 us around each fused node, a few more for each view between two). A segment (:mod:`replay_segments` finds
them: fused nodes and the views, slices and size reads between them, nothing that computes) records its kernel
calls on a forward that took every node's fast call, as views into the tensors of that forward, and from then on
runs them in one C++ call for inputs of the same signature.

What a replay stands on, and what it checks on each call:

- the input signature: each input's shape, strides, dtype and device (what the views between the nodes, the fast
  calls' checks and the values computed from sizes read), the non-tensor inputs' values, and the autocast state;
- every fused layer's kernel is still the one recorded (the graph's guard drops a kernel whose tensors changed),
  and each tensor a norm reads in place is still the model's (a parameter replaced is seen at once);
- the inputs do not overlap (each recorded view belongs to one input);
- no other thread is replaying it (the intermediate values live in one buffer per replay): a second caller runs
  the segment's own graph.

The intermediate values live in one buffer, placed by when each is first written and last read (two values alive at
once never share bytes), so a replay holds no more than the largest set of values alive together. The values the
rest of the graph reads are allocated on each call, as the nodes would have allocated them.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from ember import _C
from ember._graph.ops import call_of, is_pad
from ember._optimize.graph.fast_calls import CHECKED, RECORDING, bind_called_modules
from ember._optimize.graph.folded_node import FoldedConstant
from ember._optimize.graph.known_masks import KnownMask, recognize
from ember._optimize.inference.common import cpu_autocast_dtype, is_dense
from ember._tensor import dlpack

# Input signatures kept per segment (a model serves a few sizes at a time), and recordings tried per signature
# (the first forwards of a signature take the nodes' general calls, which record nothing).
_SIGNATURES = 8
_TRIES = 3
# Byte alignment of each intermediate value in the shared buffer (a cache line; oneDNN asks no more).
_ALIGN = 64


@dataclass
class _Call:
    """One kernel call as a fast call made it: ``kind``, the layer object, and its arguments in the order of the
    replay's method of that name; ``written``: the arguments it writes."""

    kind: str
    layer: Any
    args: tuple[Any, ...]
    written: tuple[int, ...]
    constants: tuple[int, ...] = ()  # arguments read in place from the model (weights), bound for the replay's life
    allocates: torch.Tensor | None = None  # a value the call writes part of (a cat's input's copy): all of it is new
    # an attention's: the mask the node was given, and how the node reads it (bool_mask_keeps, or "fills" where the
    # node fills the scores where it is True: FusedAttention.mask_fill)
    given_mask: tuple[Any, bool | str] | None = None


class Recorder:
    """Collects the kernel calls of one forward of a segment (the fast calls report them, fast_calls.py,
    norm_node.py, attention_node.py); ``spoiled`` where a call was made in a way a replay could not repeat."""

    def __init__(self) -> None:
        self.calls: list[_Call] = []
        self.checks: list[tuple[Any, torch.Tensor]] = []  # (TensorRef, the tensor it gave), checked on each replay
        self.spoiled = False
        # A fast call's input rounded to bf16 before its kernel (an fp32 residual stream read by a bf16 layer): a step
        # of its own, before the call's (not a call of a fused node, so kept apart for the count)
        self.conversions: list[_Call] = []
        # How many of the calls are no fused node's (conversions, and copies the graph's data movement made): the
        # rest are one per fused node.
        self.steps_of_no_node = 0
        self.folded_values: list[torch.Tensor] = []  # values of weight transforms the segment read

    def linear(self, layer: Any, x: torch.Tensor, weight: torch.Tensor | None, out: torch.Tensor,
               entries: tuple[str, ...], residual: torch.Tensor | None) -> None:  # fmt: skip
        self._converted()
        self.calls.append(_Call("linear", layer, (x, weight, out, list(entries), residual), (2,), (1,)))

    def convolution(self, layer: Any, x: torch.Tensor, out: torch.Tensor, entries: tuple[str, ...],
                    residual: torch.Tensor | None) -> None:  # fmt: skip
        self._converted()
        self.calls.append(_Call("convolution", layer, (x, out, list(entries), residual), (1,)))

    def row_norm(self, kind: str, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None,
                 bias: torch.Tensor | None, eps: float, out: torch.Tensor, sum_out: torch.Tensor | None,
                 low: torch.Tensor | None, refs: tuple[Any, Any]) -> None:  # fmt: skip
        args = (kind, x, residual, weight, bias, eps, out, sum_out, low)
        self.calls.append(_Call("row_norm", None, args, (6, 7, 8), (3, 4)))
        for ref, t in zip(refs, (weight, bias)):
            if ref is None or t is None:
                if ref is not None or t is not None:
                    self.spoiled = True  # (a weight that is no ref's: passed in, or flattened for the kernel)
                continue
            self.checks.append((ref, t))

    def _converted(self) -> None:
        """The conversions reported since the last call, as steps of their own before it."""
        self.calls.extend(self.conversions)
        self.steps_of_no_node += len(self.conversions)
        self.conversions = []

    def round_bf16(self, x: torch.Tensor, out: torch.Tensor) -> None:
        if x.dtype != torch.float32 or out.dtype != torch.bfloat16:
            self.spoiled = True  # (a conversion the replay has no step for)
            return
        self.conversions.append(_Call("round_bf16", None, (x, out), (1,)))

    def moved(self, src: torch.Tensor, value: torch.Tensor) -> None:
        """A node of the segment that moves data (``contiguous``, ``clone``, a ``reshape`` or conversion of its input)
        gave ``value`` in memory of its own: a step that makes it (a copy of the same elements, or the rounding of a
        float32 input to bf16 in its layout), where there is one; otherwise nothing, and the recording fails where a
        kernel reads the value."""
        self._converted()
        if value.numel() == 0 or value.numel() != src.numel():
            return
        if value.dtype == src.dtype:
            if value.shape == src.shape and is_dense(value):
                out = value  # (clone keeps the layout of a dense input)
            elif value.is_contiguous():
                out = value.view(src.shape)  # the copy's result read in src's sizes, in row-major order
            else:
                return
            self.calls.append(_Call("copy", None, (src, out), (1,)))
        elif src.dtype == torch.float32 and value.dtype == torch.bfloat16 and value.shape == src.shape:
            if not (is_dense(src) and src.stride() == value.stride()):
                return
            self.calls.append(_Call("round_bf16", None, (src, value), (1,)))
        else:
            return
        self.steps_of_no_node += 1

    def concatenated(self, sources: list[Any], dim: int, value: torch.Tensor) -> None:
        """A ``cat`` of the segment gave ``value``: a copy step for each source, into its part of the value."""
        self._converted()
        offset = 0
        for src in sources:
            if not isinstance(src, torch.Tensor) or src.dtype != value.dtype or src.dim() != value.dim():
                return  # (a promotion, a legacy empty input: no step; a kernel reading the value fails the recording)
            size = src.shape[dim]
            if size:
                self.calls.append(_Call("copy", None, (src, value.narrow(dim, offset, size)), (1,), allocates=value))
                self.steps_of_no_node += 1
            offset += size

    def padded(self, src: torch.Tensor, pad: list[Any], mode: Any, fill: Any, value: torch.Tensor) -> None:
        """A constant pad by zeros of the segment gave ``value``: its border zeroed and ``src`` copied inside, as steps
        (a pad by nothing: one copy); any other pad has no step."""
        self._converted()
        if mode not in (None, "constant") or fill not in (None, 0, 0.0) or value.dtype != src.dtype:
            return
        if not all(isinstance(p, int) and p >= 0 for p in pad) or len(pad) % 2 or len(pad) // 2 > src.dim():
            return
        inside = value
        for k in range(len(pad) // 2):
            dim = value.dim() - 1 - k
            inside = inside.narrow(dim, pad[2 * k], src.shape[dim])
        if inside.shape != src.shape:
            return
        if inside.numel() != value.numel():
            self.calls.append(_Call("zero", None, (value,), (0,)))
            self.steps_of_no_node += 1
        self.calls.append(_Call("copy", None, (src, inside), (1,), allocates=value))
        self.steps_of_no_node += 1

    def multiply(self, x: torch.Tensor, factor: torch.Tensor, out: torch.Tensor) -> None:
        self.calls.append(_Call("multiply", None, (x, factor, out), (2,)))

    def gather_rows(self, src: torch.Tensor, rows: torch.Tensor, out: torch.Tensor) -> None:
        self._converted()
        self.calls.append(_Call("gather_rows", None, (src, rows, out), (2,), (1,)))

    def folded(self, module: Any, value: Any) -> None:
        """A weight transform of the segment (FoldedConstant) gave ``value``: read in place by the replay, which
        checks on each call that the transform's value is still that tensor (a weight changed makes it anew)."""
        if isinstance(value, torch.Tensor):
            self.folded_values.append(value)
            self.checks.append((_FoldedRef(module), value))

    def max_pool2d(self, x: torch.Tensor, kernel: list[int], stride: list[int], padding: list[int],
                   dilation: list[int], ceil_mode: bool, relu: bool, out: torch.Tensor) -> None:  # fmt: skip
        args = (x, list(kernel), list(stride), list(padding), list(dilation), ceil_mode, relu, out)
        self.calls.append(_Call("max_pool2d", None, args, (7,)))

    def avg_pool2d(self, x: torch.Tensor, kernel: list[int], stride: list[int], padding: list[int], ceil_mode: bool,
                   count_include_pad: bool, divisor_override: int, out: torch.Tensor) -> None:  # fmt: skip
        args = (x, list(kernel), list(stride), list(padding), ceil_mode, count_include_pad, divisor_override, out)
        self.calls.append(_Call("avg_pool2d", None, args, (7,)))

    def batch_norm(self, x: torch.Tensor, tensors: tuple[torch.Tensor, ...], refs: tuple[Any, ...], eps: float,
                   relu: bool, out: torch.Tensor) -> None:  # fmt: skip
        """A per-channel batch norm: ``tensors`` (weight, bias, mean, var) read in place, each the model's tensor its
        ref gives (checked on each replay) or, where the ref is None, the node's own (ones or zeros)."""
        self.calls.append(_Call("batch_norm", None, (x, *tensors, eps, relu, out), (7,), (1, 2, 3, 4)))
        self.checks.extend((ref, t) for ref, t in zip(refs, tensors) if ref is not None)

    def rotary_embedding(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor) -> None:
        self.calls.append(_Call("rotary_embedding", None, (x, cos, sin, out), (3,)))

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool,
                  scale: float, out: torch.Tensor, given_mask: Any, reading: bool | str) -> None:  # fmt: skip
        # A mask the node was given but read otherwise (recognized as no mask or as the causal triangle, or filled
        # into another tensor) is a decision taken on its values: a replay repeats it only for a mask computed from
        # sizes, or for an input it recognizes again, the same, on each call. ``reading``: the node's
        # bool_mask_keeps, or "fills" (a bool condition where the node fills the scores).
        args = (q, k, v, mask, causal, scale, out)
        self.calls.append(_Call("attention", None, args, (6,), given_mask=(given_mask, reading)))


class _FoldedRef:
    """A weight transform's value where it lives now, as a replay's check reads a tensor ref (``get``)."""

    __slots__ = ("module",)

    def __init__(self, module: Any) -> None:
        self.module = module

    def get(self) -> Any:
        return self.module.value


@dataclass
class _Region:
    """Memory a recorded view may lie in: an input (slot), a value a call wrote (buffer), or a constant."""

    start: int
    end: int
    kind: str  # "input", "buffer" or "constant"
    index: int  # the input's or buffer's number, or the constant's slot
    tensor: torch.Tensor
    first: int = 0  # buffers: the first and the last call that touches it
    last: int = 0
    escapes: bool = False


@dataclass
class _Built:
    """A replay and what its calls need around it."""

    native: Any
    # The segment's tensor inputs, as the first slots: one per group of inputs whose memory overlaps (a tensor and
    # views of it), each (position of its lowest-lying input, elements of that dtype the group spans, byte extent,
    # ((position, bytes above the lowest), ...) for the others).
    groups: tuple[tuple[int, int, int, tuple[tuple[int, int], ...]], ...]
    returned: tuple[tuple[tuple[int, ...], tuple[int, ...], torch.dtype], ...]  # values allocated per call
    outputs: Any  # how to make each of the segment's results (see _output_spec)
    kernels: tuple[tuple[Any, Any], ...]  # (cache, kernel) of every fused layer whose kernel a step calls
    checks: tuple[tuple[Any, torch.Tensor, int], ...]  # (ref, tensor, data pointer) read in place by a step
    # ((input slot, sizes, strides, element offset, how the node reads it), verdict): an input mask the attention's
    # kernel read by what the node made of it (_verdict), which each replay checks it makes again
    masks: tuple[tuple[tuple[Any, ...], Any], ...]


def _extent(t: torch.Tensor) -> int:
    """The bytes from ``t``'s first element to one past the last it reaches (0 for no elements)."""
    if t.numel() == 0:
        return 0
    return (sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1) * t.element_size()


def _locate(regions: Iterable[_Region], t: torch.Tensor) -> tuple[_Region, int] | None:
    start = t.data_ptr()
    end = start + _extent(t)
    for region in regions:
        if region.start <= start and end <= region.end:
            return region, start - region.start
    return None


class _Failed(Exception):
    """The recorded forward cannot be replayed (a value computed outside the kernels, a decision taken on values)."""


def _constants_of(env: dict[fx.Node, Any], gm: fx.GraphModule) -> list[torch.Tensor]:
    """The tensors the segment computed from sizes alone (its ShapeValues nodes), the same for every call of the
    signature."""
    from ember._optimize.graph.shape_values_node import ShapeValues

    found: list[torch.Tensor] = []

    def collect(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (tuple, list)):
            for v in value:
                collect(v)

    for node, value in env.items():
        if node.op == "call_module" and isinstance(gm.get_submodule(str(node.target)), ShapeValues):
            collect(value)
    return found


def build(gm: fx.GraphModule, args: tuple[Any, ...], env: dict[fx.Node, Any], results: Any,
          recorder: Recorder, kernels: tuple[Any, ...]) -> _Built:  # fmt: skip
    """The replay of ``recorder``'s calls, which ``gm`` made on ``args`` (``env``: each node's value; ``kernels``:
    the segment's fused nodes, each of which must have recorded one call). Raises _Failed where it cannot be one."""
    calls = recorder.calls
    if recorder.spoiled or recorder.conversions or len(calls) - recorder.steps_of_no_node != len(kernels):
        raise _Failed("not every node took its fast call")
    regions, groups = _input_groups(args)
    constants = [
        _Region(t.data_ptr(), t.data_ptr() + _extent(t), "constant", -1, t)
        for t in (*_constants_of(env, gm), *recorder.folded_values)
    ]

    # Each tensor a call writes that lies in no known memory is a new value (a buffer); every tensor it reads must
    # lie in an input, a buffer written before, or a constant.
    buffers: list[_Region] = []
    located: list[list[Any]] = []
    guards: dict[tuple[Any, ...], Any] = {}
    for step, call in enumerate(calls):
        places: list[Any] = [None] * len(call.args)
        for t in (call.allocates, *(call.args[i] for i in call.written)):
            if t is None:
                continue
            if _locate(regions + buffers, t) is None:
                start = t.data_ptr()
                buffers.append(_Region(start, start + _extent(t), "buffer", len(buffers), t, step, step))
        for i, a in enumerate(call.args):
            if not isinstance(a, torch.Tensor):
                continue
            if i in call.constants:
                places[i] = ("constant", a)
                continue
            found = _locate(regions + buffers + constants, a)
            if found is None:
                raise _Failed(f"a {call.kind} call reads a tensor computed outside the kernels")
            region, offset = found
            if region.kind == "buffer":
                region.last = step
            places[i] = (region, offset, a)
        if call.kind == "attention":
            _mask_guard(call, places[3], regions, constants, guards)
        located.append(places)

    outputs = _output_spec(results, regions, buffers, constants)
    escaping = [b for b in buffers if b.escapes]
    for j, b in enumerate(escaping):
        b.index = j
    arena, offsets = _place([b for b in buffers if not b.escapes])

    native = _C.Replay(len(groups) + len(escaping))
    arena_slot = native.constant(arena) if arena is not None else -1
    bound: dict[int, int] = {}  # a constant's slot, by the id of its tensor (alive in the recorded calls meanwhile)

    def slot_of(place: Any) -> Any:
        if place is None:
            return None
        if place[0] == "constant":
            t = place[1].detach()  # (read in place, as the fast call read it; autograd is off in a replay)
            slot = bound.get(id(place[1]))
            if slot is None:
                slot = bound[id(place[1])] = native.constant(t)
            return (slot, 0, t)
        region, offset, t = place
        t = t.detach()  # (an input that requires grad, called under no_grad: only its sizes, strides and dtype)
        if region.kind == "input":
            return (region.index, offset, t)
        if region.kind == "buffer" and region.escapes:
            return (len(groups) + region.index, offset, t)
        if region.kind == "buffer":
            return (arena_slot, offsets[id(region)] + offset, t)
        slot = bound.get(id(region.tensor))
        if slot is None:
            slot = bound[id(region.tensor)] = native.constant(region.tensor.detach())
        return (slot, offset, t)

    for call, places in zip(calls, located):
        a = [slot_of(p) if p is not None else v for p, v in zip(places, call.args)]
        # Each kind is the native Replay's method of that name; a fused layer's call passes its kernel first.
        getattr(native, call.kind)(*(() if call.layer is None else (call.layer,)), *a)

    returned = tuple((tuple(b.tensor.shape), tuple(b.tensor.stride()), b.tensor.dtype) for b in escaping)
    for region in regions + buffers:
        region.tensor = None  # type: ignore[assignment]  # (the results' specs keep the regions, not the tensors)
    layer_kernels = tuple((node.state.cache, node.state.cache.kernel) for node in kernels if hasattr(node, "state"))
    checks = tuple((ref, t, t.data_ptr()) for ref, t in recorder.checks)
    return _Built(native, groups, returned, outputs, layer_kernels, checks, tuple(guards.items()))


def _input_groups(args: tuple[Any, ...]) -> tuple[list[_Region], tuple[Any, ...]]:
    """The memory of the segment's tensor inputs, one region (and slot) per group of inputs that overlap, and the
    groups as _Built keeps them. Views into a group are placed from its lowest-lying input, which each replay checks
    the others still lie at the same distance from."""
    spans = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            if not a.is_cpu:
                raise _Failed("an input is not on the CPU")
            spans.append((a.data_ptr(), a.data_ptr() + _extent(a), i))
    spans.sort()
    regions: list[_Region] = []
    groups: list[tuple[int, int, int, tuple[tuple[int, int], ...]]] = []
    members: list[tuple[int, int, int]] = []
    for span in [*spans, None]:
        if members and (span is None or span[0] >= max(end for _, end, _ in members) or span[0] == span[1]):
            lead_start, _, lead = members[0]
            end = max(e for _, e, _ in members)
            t = args[lead]
            size = t.element_size()
            others = tuple((i, start - lead_start) for start, _, i in members[1:])
            if any(args[i].dtype != t.dtype or delta % size for i, delta in others):
                raise _Failed("overlapping inputs of different dtypes")
            regions.append(_Region(lead_start, end, "input", len(groups), t))
            groups.append((lead, -(-(end - lead_start) // size), end - lead_start, others))
            members = []
        if span is not None:
            members.append(span)
    return regions, tuple(groups)


def _mask_guard(
    call: _Call, place: Any, regions: list[_Region], constants: list[_Region], guards: dict[Any, Any]
) -> None:
    """Where the attention's kernel read its mask otherwise than as given: a guard (the mask's view of an input, and
    what the recognition made of it) that each replay checks, or _Failed where none can tell."""
    assert call.given_mask is not None
    given, reading = call.given_mask
    if not isinstance(given, torch.Tensor) or _locate(constants, given) is not None:
        return  # no mask, or one computed from sizes: the same on every call of the signature
    found = _locate(regions, given)
    if found is None:
        raise _Failed("the attention's mask was computed outside the kernels")
    region, offset = found
    if place is not None and place[0] is region and place[2].data_ptr() == given.data_ptr():
        return  # read as given: right whatever its values
    if place is not None or offset % given.element_size():
        raise _Failed("the attention's mask was rewritten by its values")
    verdict = _verdict(given, reading)
    if verdict is KnownMask.OTHER:
        raise _Failed("the attention's mask was read by its values")
    view = (region.index, tuple(given.shape), tuple(given.stride()), offset // given.element_size(), reading)
    guards[view] = verdict


def _verdict(mask: torch.Tensor, reading: bool | str) -> KnownMask:
    """What an attention node made of ``mask``, as it reads it: by known_masks.recognize, or, for a condition the node
    fills the scores where it holds, NOTHING where it holds nowhere (the node then reads no mask)."""
    if reading == "fills":
        return KnownMask.OTHER if bool(mask.any()) else KnownMask.NOTHING
    return recognize(mask, bool(reading))


def _output_spec(value: Any, regions: list[_Region], buffers: list[_Region], constants: list[_Region]) -> Any:
    """How a replay makes ``value``, a result of the segment: ("input" | "buffer", region, sizes, strides, element
    offset), ("value", v) for a constant of the signature, ("tuple", specs); buffers read so are marked escaping."""
    if isinstance(value, tuple):
        return ("tuple", tuple(_output_spec(v, regions, buffers, constants) for v in value))
    if isinstance(value, torch.Tensor):
        found = _locate(regions + buffers, value)
        if found is None:
            if _locate(constants, value) is not None:
                return ("value", value)
            raise _Failed("a result was computed outside the kernels")
        region, offset = found
        if region.tensor.dtype != value.dtype or offset % value.element_size():
            raise _Failed("a result reinterprets the bytes of another dtype")
        if region.kind == "buffer":
            region.escapes = True
        whole = offset == 0 and value.shape == region.tensor.shape and value.stride() == region.tensor.stride()
        return (region.kind, region, tuple(value.shape), tuple(value.stride()), offset // value.element_size(), whole)
    if value is None or isinstance(value, (int, float, bool, torch.Size, torch.dtype)):
        return ("value", value)
    raise _Failed(f"a result of type {type(value).__name__}")


def _place(buffers: list[_Region]) -> tuple[torch.Tensor | None, dict[int, int]]:
    """One buffer for the intermediate values and each value's byte offset in it: the largest first, each at the
    lowest offset clear of every value placed before it whose calls overlap its own."""
    offsets: dict[int, int] = {}
    placed: list[tuple[int, int, _Region]] = []
    total = 0
    for b in sorted(buffers, key=lambda r: r.end - r.start, reverse=True):
        size = b.end - b.start
        busy = sorted((o, o + (p.end - p.start)) for o, _, p in placed if p.first <= b.last and b.first <= p.last)
        offset = 0
        for lo, hi in busy:
            if offset + size <= lo:
                break
            offset = max(offset, -(-hi // _ALIGN) * _ALIGN)
        offsets[id(b)] = offset
        placed.append((offset, size, b))
        total = max(total, offset + size)
    if not buffers:
        return None, offsets
    return torch.empty(max(total, 1), dtype=torch.uint8), offsets


class _Interpreter(fx.Interpreter):
    """Runs the segment's graph and keeps each node's value (a recording needs to know what computed what); a node
    that moves data (every node of a segment but its fused ones) and gave a tensor outside its input's memory made a
    copy, which it reports to ``recorder``."""

    def __init__(self, gm: fx.GraphModule, recorder: Recorder) -> None:
        super().__init__(gm)
        self.values: dict[fx.Node, Any] = {}
        self.recorder = recorder

    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        self.values[n] = value
        if n.op == "call_module":
            module = self.module.get_submodule(str(n.target))
            if isinstance(module, FoldedConstant):
                self.recorder.folded(module, value)
        elif isinstance(value, torch.Tensor) and n.args:
            if is_pad(n):
                self._padded(n, value)
                return value
            call = call_of(n, self.module)
            if call is not None and call.op == "cat":
                listed, dim = call.operands.get("tensors"), call.operands.get("dim", 0)
                if isinstance(listed, (list, tuple)) and isinstance(dim, int):
                    sources = [self.values.get(a) if isinstance(a, fx.Node) else a for a in listed]
                    self.recorder.concatenated(sources, dim % value.dim(), value)
                return value
            src = self.values.get(n.args[0]) if isinstance(n.args[0], fx.Node) else None
            if isinstance(src, torch.Tensor) and _locate([_span(src)], value) is None:
                self.recorder.moved(src, value)
        return value

    def _padded(self, n: fx.Node, value: torch.Tensor) -> None:
        """A pad's operands as this forward gave them (its pad sizes may be values computed from sizes)."""
        named: tuple[str, ...] = ("input", "pad", "mode", "value")
        if str(n.target) == "aten.constant_pad_nd.default":
            named = ("input", "pad", "value")
        bound = dict(zip(named, n.args))
        bound.update(n.kwargs)

        def resolved(a: Any) -> Any:
            return self.values.get(a) if isinstance(a, fx.Node) else a

        src, pad = resolved(bound.get("input", bound.get("self"))), resolved(bound.get("pad"))
        if not isinstance(src, torch.Tensor) or not isinstance(pad, (list, tuple)):
            return
        mode = resolved(bound.get("mode", "constant"))
        self.recorder.padded(src, [resolved(p) for p in pad], mode, resolved(bound.get("value")), value)


def _span(t: torch.Tensor) -> _Region:
    return _Region(t.data_ptr(), t.data_ptr() + _extent(t), "input", 0, t)


def _signature(args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    key: list[Any] = [cpu_autocast_dtype()]
    for a in args:
        if isinstance(a, torch.Tensor):
            key.append((a.shape, a.stride(), a.dtype, a.is_cpu))
        elif a is None or isinstance(a, (int, float, bool, str, torch.dtype)):
            key.append(a)
        else:
            return None
    return tuple(key)


class ReplaySegment(nn.Module):
    """A run of the graph's nodes (``graph``: its inputs in, its values read after it out, as a tuple), replayed
    from its recorded kernel calls where a call's signature has one (see the module's docstring), else run as it
    is. ``kernels``: the fused nodes in it, in their order."""

    # False: every segment runs its own nodes (benchmarks/profile_graph.py times them one by one).
    enabled = True

    def __init__(self, graph: fx.GraphModule, kernels: tuple[nn.Module, ...], origin: str) -> None:
        super().__init__()
        self.graph_module = graph
        self.kernels = kernels
        self.origin = origin
        self._reset()

    def _reset(self) -> None:
        self._replays: dict[tuple[Any, ...], _Built] = {}
        self._tries: dict[tuple[Any, ...], int] = {}
        self._lock = threading.Lock()
        self.refused: str | None = None  # why the last recording could not be replayed
        bind_called_modules(self.graph_module)

    def __getstate__(self) -> dict[str, Any]:
        # Recordings hold native objects and the model's tensors: a copy or pickle records its own.
        return {k: v for k, v in self.__dict__.items() if k not in ("_replays", "_tries", "_lock", "refused")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def __deepcopy__(self, memo: dict[int, Any]) -> ReplaySegment:
        # The segment's graph through its pickling form, with this copy's memo (as GraphForward copies the whole
        # graph): torch 1.13's GraphModule.__deepcopy__ starts a memo of its own, so its fused nodes would be copies
        # other than those of ``kernels``, reading another copy of the model.
        copied = ReplaySegment.__new__(ReplaySegment)
        memo[id(self)] = copied
        state = self.__getstate__()
        modules = state.pop("_modules")
        copied.__dict__.update(copy.deepcopy(state, memo))
        rebuild, args = self.graph_module.__reduce__()[:2]
        graph = rebuild(*copy.deepcopy(args, memo))
        memo[id(self.graph_module)] = graph
        copied.__dict__["_modules"] = type(modules)(
            (name, graph if m is self.graph_module else copy.deepcopy(m, memo)) for name, m in modules.items()
        )
        copied._reset()
        return copied

    @property
    def replays(self) -> int:
        """How many input signatures this segment replays now."""
        return len(self._replays)

    def forward(self, *args: Any) -> Any:
        epoch = CHECKED.epoch
        if epoch and ReplaySegment.enabled:  # (inside a forward whose guard passed: no autograd, trace, dispatch mode)
            key = _signature(args)
            if key is not None:
                built = self._replays.get(key)
                if built is not None:
                    results = self._replay(built, args, key, epoch)
                    if results is not None:
                        return results
                elif self._tries.get(key, 0) < _TRIES:
                    return self._record(key, args)
        return self.graph_module(*args)

    def _replay(self, built: _Built, args: tuple[Any, ...], key: tuple[Any, ...], epoch: int) -> Any:
        for cache, kernel in built.kernels:
            if cache.kernel is not kernel or cache.checked != epoch:
                self._replays.pop(key, None)  # a layer's tensors changed: record again
                return None
        for ref, t, ptr in built.checks:
            if ref.get() is not t or t.data_ptr() != ptr:
                self._replays.pop(key, None)
                return None
        tensors = _group_tensors(built.groups, args)
        if tensors is None:
            return None
        for (slot, sizes, strides, offset, reading), verdict in built.masks:
            base = args[built.groups[slot][0]]
            if _verdict(base.as_strided(sizes, strides, base.storage_offset() + offset), reading) is not verdict:
                return None  # (this call's mask means something else: the graph runs it)
        if not self._lock.acquire(blocking=False):
            return None  # another thread replays it: its buffer is taken
        try:
            returned = [torch.empty_strided(s, st, dtype=d) for s, st, d in built.returned]
            built.native.run([*map(_slot, tensors), *map(dlpack, returned)])
        finally:
            self._lock.release()
        return _make(built.outputs, args, built.groups, returned)

    def _record(self, key: tuple[Any, ...], args: tuple[Any, ...]) -> Any:
        if not self._lock.acquire(blocking=False):
            return self.graph_module(*args)
        try:
            self._tries[key] = self._tries.get(key, 0) + 1
            recorder = Recorder()
            previous, RECORDING.active = RECORDING.active, recorder
            try:
                interpreter = _Interpreter(self.graph_module, recorder)
                results = interpreter.run(*args)
            finally:
                RECORDING.active = previous
            try:
                built = build(self.graph_module, args, interpreter.values, results, recorder, self.kernels)
            except _Failed as failed:
                self.refused = str(failed)
                return results
            except Exception as error:  # a recording the replay refuses is a bug of ember's, never the caller's
                self._tries[key] = _TRIES
                self.refused = f"{type(error).__name__}: {error}"
                return results
            self.refused = None
            for old in list(self._replays)[: max(0, len(self._replays) - _SIGNATURES + 1)]:
                self._replays.pop(old, None)  # (the oldest signatures first)
            self._replays[key] = built
            return results
        finally:
            self._lock.release()

    def extra_repr(self) -> str:
        return f"{self.origin}: {len(self.kernels)} fused node(s) replayed in one call"


def _group_tensors(groups: tuple[Any, ...], args: tuple[Any, ...]) -> list[torch.Tensor] | None:
    """The tensor for each group's slot (the lowest-lying input, or a 1-D view from it over the whole group), or None
    where the inputs no longer lie as recorded (a group's members moved apart, two groups overlap)."""
    tensors = []
    spans = []
    for lead, elements, extent, others in groups:
        t = args[lead]
        start = t.data_ptr()
        for i, delta in others:
            if args[i].data_ptr() - start != delta:
                return None
        # (detached: an input that requires grad, called under no_grad, is read as it is, as the nodes read it)
        tensors.append(t.detach() if not others else t.detach().as_strided((elements,), (1,), t.storage_offset()))
        if extent:
            spans.append((start, start + extent))
    if len(spans) > 1:
        spans.sort()
        if any(a[1] > b[0] for a, b in zip(spans, spans[1:])):
            return None
    return tensors


def _slot(t: torch.Tensor) -> Any:
    """An input's memory for its slot: a bool tensor (a mask no step reads as such, only the guards) as its bytes,
    which torch 1.13's DLPack export refuses as bool."""
    return dlpack(t.view(torch.uint8) if t.dtype == torch.bool else t)


def _make(spec: Any, args: tuple[Any, ...], groups: tuple[Any, ...], returned: list[torch.Tensor]) -> Any:
    kind = spec[0]
    if kind == "value":
        return spec[1]
    if kind == "tuple":
        return tuple(_make(s, args, groups, returned) for s in spec[1])
    _, region, sizes, strides, offset, whole = spec
    base = args[groups[region.index][0]] if kind == "input" else returned[region.index]
    if whole:
        return base
    return base.as_strided(sizes, strides, base.storage_offset() + offset)
