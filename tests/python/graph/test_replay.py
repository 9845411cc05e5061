"""Graph mode's replayed segments (``_optimize/graph/replay_segments.py``, ``replay.py``, ``ember._C.Replay``): a run
of fused nodes and the views between them records its kernel calls once per input signature and replays them in one
call. Each test checks the pattern found or left alone, that a replay gives the graph's own result on new values,
and that whatever a replay stands on (the layers' tensors, the input signature, a mask's meaning, the inputs'
memory, one thread at a time) is noticed when it changes."""

from __future__ import annotations

import copy
import pickle
import threading
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from graphs import HAS_EXPORT_AUTO, all_passes
from torch import nn

import ember
from ember import _C
from ember._optimize.graph import replay
from ember._optimize.graph.folded_node import FoldedConstant
from ember._optimize.graph.forward import GraphForward
from ember._optimize.graph.replay import ReplaySegment, _place, _Region
from ember._optimize.inference import common, linear
from ember._tensor import dlpack


@pytest.fixture(autouse=True)
def ember_takes_every_fp32_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """(As in test_fast_calls: the router's hand-off of small fp32 Linears to MKL's matmul on Intel CPUs would leave
    those layers to torch, whose calls a segment cannot replay.)"""
    monkeypatch.setattr(linear, "torch_fp32_matmul_is_mkl_on_intel", lambda: False)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Written out, as torch 1.13 (no F.scaled_dot_product_attention) has it too: graph mode fuses both forms."""
    scores = q @ k.transpose(-2, -1) * 0.35
    if mask is not None:
        scores = scores + mask
    return scores.softmax(dim=-1) @ v


class Encoder(nn.Module):
    """A post-norm encoder layer: projections, heads split by views, attention, residual adds and norms."""

    def __init__(self, width: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm1 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)
        self.norm2 = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x, None)

    def layer(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        b, n, c = x.shape[0], x.shape[1], x.shape[2]  # (symbolic tracing: a shape is no tuple to unpack)
        qkv = self.qkv(x).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        a = attention(qkv[0], qkv[1], qkv[2], mask)
        x = self.norm1(self.proj(a.transpose(1, 2).reshape(b, n, c)) + x)
        return self.norm2(self.down(F.gelu(self.up(x))) + x)


class MaskedEncoder(Encoder):
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return self.layer(x, mask)


def segments(model: nn.Module) -> list[ReplaySegment]:
    forward = model.__dict__["forward"]
    forward = getattr(forward, "inner", forward)
    return [m for m in forward.graph.modules() if isinstance(m, ReplaySegment)]


def optimized(model: nn.Module, sample: Any, dtype: torch.dtype = torch.float32) -> nn.Module:
    reference = copy.deepcopy(model).eval()
    model = ember.optimize(model.eval(), dtype=dtype, sample_input=sample)
    model._reference = reference  # type: ignore[assignment]
    return model


def run_and_compare(model: nn.Module, *inputs: Any, times: int = 3, tol: float = 1e-5) -> None:
    with torch.no_grad():
        expected = model._reference(*inputs)  # type: ignore[operator]
        for _ in range(times):
            torch.testing.assert_close(model(*inputs), expected, rtol=tol, atol=tol)


def assert_replays_as_the_nodes_run(model: nn.Module, segment: ReplaySegment, *inputs: torch.Tensor) -> None:
    """``model(*inputs)`` replays ``segment`` after a call or two and gives, bit for bit, what its nodes' own calls
    give."""
    replay.ReplaySegment.enabled = False
    try:
        with torch.no_grad():
            expected = model(*inputs)
    finally:
        replay.ReplaySegment.enabled = True
    with torch.no_grad():
        results = [model(*inputs) for _ in range(3)]
    assert segment.replays == 1, segment.refused
    for result in results:
        assert torch.equal(result, expected)


def test_an_encoder_layer_is_one_segment_and_replays_on_new_values() -> None:
    torch.manual_seed(0)
    model = optimized(Encoder(), (torch.randn(2, 8, 32),))
    (segment,) = segments(model)
    assert len(segment.kernels) == 7  # qkv, attention, proj, norm1, up, down, norm2 (the adds in the epilogues)
    run_and_compare(model, torch.randn(2, 8, 32))
    assert segment.replays == 1, segment.refused
    for _ in range(3):  # new values, the same signature: the replay's results, not the recording's
        run_and_compare(model, torch.randn(2, 8, 32), times=1)
    assert segment.replays == 1


def test_each_signature_records_its_own_replay() -> None:
    torch.manual_seed(0)
    model = optimized(Encoder(), (torch.randn(2, 8, 32),))
    (segment,) = segments(model)
    for shape in [(2, 8, 32), (1, 5, 32), (3, 8, 32), (2, 8, 32)]:
        run_and_compare(model, torch.randn(*shape))
    assert segment.replays == 3


def test_bf16_replay_is_the_graph_s_result_bit_for_bit() -> None:
    if not _C.Linear.supported("bfloat16"):
        pytest.skip("no bf16 Linear on this CPU")
    torch.manual_seed(0)
    model = ember.optimize(Encoder().eval(), dtype=torch.bfloat16, sample_input=(torch.randn(2, 8, 32),))
    (segment,) = segments(model)
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        first = model(x)  # (recorded, or the graph's own general calls)
        results = [model(x) for _ in range(3)]
    assert segment.replays == 1, segment.refused
    for result in results:
        assert torch.equal(result, first)


def test_an_operation_that_computes_ends_a_run() -> None:
    class Split(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c(torch.sin(self.b(torch.cos(self.a(x)))))

    gm = all_passes(Split(), (torch.randn(4, 8),), replay=True)
    assert not [m for m in gm.modules() if isinstance(m, ReplaySegment)]  # each run holds one fused node


def test_a_value_read_after_the_run_is_its_output() -> None:
    class TwoHeads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 8)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = self.a(x).relu()
            y = self.b(h)
            return torch.tanh(h.view(2, 2, 16)), y  # h read after the run: returned by the segment, not reused

    torch.manual_seed(0)
    model = optimized(TwoHeads(), (torch.randn(4, 8),))
    (segment,) = segments(model)
    run_and_compare(model, torch.randn(4, 8))
    assert segment.replays == 1, segment.refused
    with torch.no_grad():
        h1, _ = model(torch.ones(4, 8))
        h2, _ = model(torch.zeros(4, 8))
    assert not torch.equal(h1, h2)  # each call's value has memory of its own


@pytest.mark.parametrize("move", ["reshape", "contiguous", "expand", "clone"])
def test_copies_between_the_kernels_are_steps_of_the_replay(move: str) -> None:
    """Data movement that copies (a reshape of a transposed tensor, ``contiguous``, an expanded view made dense, a
    clone of a transposed view) is a copy step of the replay: the replay gives the nodes' results bit for bit, on
    new values too."""

    class Copying(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(4, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.a(x)
            if move == "reshape":
                y = y.transpose(0, 1).reshape(-1, 4)  # the transpose makes the reshape copy
            elif move == "contiguous":
                y = y.view(6, 2, 4).transpose(0, 1).contiguous().view(-1, 4)
            elif move == "expand":
                y = y[:1].view(1, 2, 4).expand(3, 2, 4).contiguous().view(-1, 4)
            else:
                y = y.view(6, 2, 4).transpose(0, 1).clone().reshape(-1, 4)
            return self.b(y)

    torch.manual_seed(0)
    model = optimized(Copying(), (torch.randn(6, 8),))
    (segment,) = segments(model)
    run_and_compare(model, torch.randn(6, 8), times=3)
    assert segment.replays == 1, segment.refused
    run_and_compare(model, torch.randn(6, 8), times=2)
    assert_replays_as_the_nodes_run(model, segment, torch.randn(6, 8))


def test_a_conversion_with_no_step_is_never_replayed_and_says_why() -> None:
    class Converting(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x).to(torch.float64).to(torch.float32))  # (no step rounds to or from float64)

    torch.manual_seed(0)
    model = optimized(Converting(), (torch.randn(6, 8),))
    (segment,) = segments(model)
    run_and_compare(model, torch.randn(6, 8), times=5)
    assert segment.replays == 0
    assert "outside the kernels" in str(segment.refused)


def test_a_replaced_or_changed_weight_is_seen() -> None:
    torch.manual_seed(0)
    model = optimized(Encoder(), (torch.randn(2, 8, 32),))
    (segment,) = segments(model)
    x = torch.randn(2, 8, 32)
    run_and_compare(model, x)
    assert segment.replays == 1
    for change in (
        lambda m: setattr(
            m.up, "weight", nn.Parameter(torch.linspace(-1, 1, m.up.weight.numel()).view_as(m.up.weight))
        ),
        lambda m: m.down.weight.data.mul_(-1),
        lambda m: setattr(m.norm2, "weight", nn.Parameter(torch.linspace(0.5, 2, m.norm2.weight.numel()))),
        lambda m: m.norm1.bias.data.add_(1),
    ):
        with torch.no_grad():
            change(model)
            change(model._reference)
        run_and_compare(model, x)


def test_a_padding_mask_given_as_input_is_read_by_its_meaning_on_each_call() -> None:
    torch.manual_seed(0)
    model = optimized(MaskedEncoder(), (torch.randn(2, 8, 32), torch.zeros(2, 1, 8, 8)))
    (segment,) = segments(model)
    x = torch.randn(2, 8, 32)
    no_padding = torch.zeros(2, 1, 8, 8)  # recognized as no mask: the kernel runs without it
    run_and_compare(model, x, no_padding)
    assert segment.replays == 1, segment.refused
    padded = torch.zeros(2, 1, 8, 8)
    padded[1, ..., 5:] = float("-inf")  # the same signature, a mask that means something
    run_and_compare(model, x, padded)
    run_and_compare(model, x, no_padding)


_LOWEST = torch.finfo(torch.float32).min  # (a constant: torch 1.13's symbolic trace cannot read a proxy's dtype)


class FilledEncoder(Encoder):
    """DeBERTa's spelling of a padding mask: a bool condition (True: padded) the scores are filled with finfo.min
    at, and the heads split from the batch by copies (``permute(...).contiguous()``)."""

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        b, n, c = x.shape[0], x.shape[1], x.shape[2]
        d = c // self.heads
        qkv = self.qkv(x)

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, self.heads, d).permute(0, 2, 1, 3).contiguous()

        q, k, v = heads(qkv[..., :c]), heads(qkv[..., c : 2 * c]), heads(qkv[..., 2 * c :])
        padded = ~keep.bool()  # [b, 1, 1, n]
        scores = (q @ k.transpose(-2, -1) * 0.35).masked_fill(padded, _LOWEST)
        a = scores.softmax(dim=-1) @ v
        x = self.norm1(self.proj(a.permute(0, 2, 1, 3).contiguous().view(b, n, c)) + x)
        return self.norm2(self.down(F.gelu(self.up(x))) + x)


def test_a_filled_mask_replays_where_it_fills_nothing_and_copies_are_steps() -> None:
    torch.manual_seed(0)
    keep = torch.ones(2, 1, 1, 8)
    model = optimized(FilledEncoder(), (torch.randn(2, 8, 32), keep))
    (segment,) = segments(model)
    x = torch.randn(2, 8, 32)
    run_and_compare(model, x, keep)
    assert segment.replays == 1, segment.refused
    padded = keep.clone()
    padded[1, ..., 5:] = 0  # the same signature, a mask that fills: the nodes run it
    run_and_compare(model, x, padded)
    run_and_compare(model, x, keep)
    assert_replays_as_the_nodes_run(model, segment, x, keep)


def test_a_permuted_input_of_a_norm_and_a_residual_is_copied_by_a_step() -> None:
    """Whisper's first encoder layer: its frames, permuted to [batch, frames, features], are the norm's input and
    the residual of the attention's output projection: both fast calls copy them first, and the replay repeats the
    copies."""

    class Permuted(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(16)
            self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x.permute(0, 2, 1)  # [batch, features, frames] -> [batch, frames, features], not contiguous
            return self.b(self.a(self.norm(x)) + x)

    torch.manual_seed(0)
    model = optimized(Permuted(), (torch.randn(2, 16, 6),))
    (segment,) = segments(model)
    run_and_compare(model, torch.randn(2, 16, 6), times=3)
    assert segment.replays == 1, segment.refused
    assert_replays_as_the_nodes_run(model, segment, torch.randn(2, 16, 6))


def test_inputs_that_share_memory_replay_only_where_they_lie_as_recorded() -> None:
    class Both(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x) + y)

    torch.manual_seed(0)
    model = optimized(Both(), (torch.randn(4, 8), torch.randn(4, 8)))
    base = torch.randn(8, 8)
    run_and_compare(model, base[:4], base[4:])
    run_and_compare(model, base[:4], base[:4])  # now the same memory: still the graph's result
    run_and_compare(model, torch.randn(4, 8), torch.randn(4, 8))


def test_threads_replaying_one_model_at_once_get_their_own_results() -> None:
    torch.manual_seed(0)
    model = optimized(Encoder(), (torch.randn(2, 8, 32),))
    run_and_compare(model, torch.randn(2, 8, 32))
    inputs = [torch.randn(2, 8, 32) for _ in range(4)]
    with torch.no_grad():
        expected = [model._reference(x) for x in inputs]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            with torch.no_grad():
                for _ in range(20):
                    torch.testing.assert_close(model(inputs[i]), expected[i], rtol=1e-5, atol=1e-5)
        except BaseException as e:  # (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_a_copy_and_a_pickle_record_their_own() -> None:
    torch.manual_seed(0)
    model = optimized(Encoder(), (torch.randn(2, 8, 32),))
    x = torch.randn(2, 8, 32)
    run_and_compare(model, x)
    for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        (segment,) = segments(other)
        assert segment.replays == 0
        with torch.no_grad():
            other.up.weight.mul_(2)  # its own parameters: the original's replay must not be what it runs
            results = [other(x) for _ in range(3)]
        assert segment.replays == 1, segment.refused
        with torch.no_grad():
            reference = copy.deepcopy(model._reference)
            reference.up.weight.mul_(2)
            torch.testing.assert_close(results[-1], reference(x), rtol=1e-5, atol=1e-5)


def test_autograd_and_training_never_replay() -> None:
    torch.manual_seed(0)
    model = optimized(Encoder(), (torch.randn(2, 8, 32),))
    x = torch.randn(2, 8, 32, requires_grad=True)
    run_and_compare(model, x.detach())
    y = model(x)  # grad mode: the graph's guard does not pass, the nodes run torch's operations
    y.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_intermediate_values_share_memory_only_when_never_alive_together() -> None:
    def region(size: int, first: int, last: int) -> _Region:
        return _Region(0, size, "buffer", 0, torch.empty(0), first, last)

    a, b, c, d = region(1000, 0, 1), region(1000, 1, 2), region(500, 2, 3), region(64, 4, 4)
    arena, offsets = _place([a, b, c, d])
    assert arena is not None
    spans = {name: (offsets[id(r)], offsets[id(r)] + r.end) for name, r in zip("abcd", (a, b, c, d))}
    overlapping = {("a", "b"), ("b", "c")}  # alive in one call
    for x, y in overlapping:
        assert spans[x][1] <= spans[y][0] or spans[y][1] <= spans[x][0]
    assert spans["c"][0] < spans["a"][1]  # c reuses a's bytes: a was last read before c was written
    assert arena.numel() <= 2000 + 64
    assert all(offset % 64 == 0 for offset in offsets.values())


def test_the_native_replay_refuses_what_it_cannot_run_and_writes_nothing() -> None:
    weight, x = torch.randn(6, 4), torch.randn(3, 4)
    layer = _C.Linear(dlpack(weight), None, "float32")
    r = _C.Replay(2)
    r.linear(layer, (0, 0, x), None, (1, 0, torch.empty(3, 6)), [], None)
    out = torch.zeros(3, 6)
    r.run([dlpack(x), dlpack(out)])
    torch.testing.assert_close(out, x @ weight.T)
    untouched = torch.full((3, 6), 7.0)
    with pytest.raises(ValueError, match="takes 2 tensors"):
        r.run([dlpack(x)])
    with pytest.raises(ValueError, match="reaches"):
        r.run([dlpack(x[:2]), dlpack(untouched)])  # too small for the recorded view
    with pytest.raises(ValueError, match="reaches"):
        r.run([dlpack(x), dlpack(torch.zeros(3, 5))])
    assert torch.equal(untouched, torch.full((3, 6), 7.0))
    with pytest.raises(ValueError, match="slot"):
        r.linear(layer, (5, 0, x), None, (1, 0, out), [], None)
    with pytest.raises(ValueError, match="offset"):
        r.linear(layer, (0, -4, x), None, (1, 0, out), [], None)
    with pytest.raises(TypeError, match="tuple"):
        r.linear(layer, x, None, (1, 0, out), [], None)
    with pytest.raises(ValueError, match="epilogue"):
        r.linear(layer, (0, 0, x), None, (1, 0, out), ["nonsense"], None)
    constant = r.constant(torch.randn(2))
    with pytest.raises(ValueError, match="past the end"):
        r.row_norm("layer", (0, 0, x), None, (constant, 0, torch.randn(4)), None, 1e-5, (1, 0, out), None, None)
    with pytest.raises(ValueError, match="src's dtype and sizes"):
        r.copy((0, 0, x), (1, 0, torch.empty(4, 3)))
    assert r.steps == 1 and r.slots == 3
    # A copy step whose out overlaps its src on a run (two views of one input) refuses it before writing.
    c = _C.Replay(1)
    c.copy((0, 0, torch.empty(2, 3).t()), (0, 8, torch.empty(3, 2)))
    shared = torch.arange(12.0)
    with pytest.raises(ValueError, match="share"):
        c.run([dlpack(shared)])
    assert torch.equal(shared, torch.arange(12.0))
    # A gather step: rows bound for the replay's life, checked (every index) before anything is written.
    g = _C.Replay(2)
    src = torch.arange(12.0).view(4, 3)
    rows = g.constant(torch.tensor([3, 0, 3]))
    g.gather_rows((0, 0, src), (rows, 0, torch.zeros(3, dtype=torch.int64)), (1, 0, torch.empty(3, 3)))
    gathered = torch.zeros(3, 3)
    g.run([dlpack(src), dlpack(gathered)])
    assert torch.equal(gathered, src[[3, 0, 3]])
    bad = _C.Replay(2)
    far = bad.constant(torch.tensor([0, 4, 1]))
    bad.gather_rows((0, 0, src), (far, 0, torch.zeros(3, dtype=torch.int64)), (1, 0, torch.empty(3, 3)))
    untouched = torch.full((3, 3), 7.0)
    with pytest.raises(IndexError, match="rows"):
        bad.run([dlpack(src), dlpack(untouched)])
    assert torch.equal(untouched, torch.full((3, 3), 7.0))


_HALF = 4  # half of Rotary's head width


class Rotary(nn.Module):
    """A decoder's attention: rotate-half rotary embeddings of q and k (cos and sin given), the attention, and the
    residual stream converted to the dtype it already has (a Llama's ``hidden_states.to(torch.float32)``)."""

    def __init__(self, width: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape[0], x.shape[1], x.shape[2]
        d = c // self.heads

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, self.heads, d).transpose(1, 2)

        def rotated(t: torch.Tensor) -> torch.Tensor:  # (Hugging Face's apply_rotary_pos_emb, its tables [b, l, d])
            half = torch.cat((-t[..., _HALF:], t[..., :_HALF]), dim=-1)
            return t * cos.unsqueeze(1) + half * sin.unsqueeze(1)

        q, k, v = rotated(heads(self.q(x))), rotated(heads(self.k(x))), heads(self.v(x))
        a = attention(q, k, v)
        return self.o(a.transpose(1, 2).reshape(b, n, c)).to(torch.float32) + x.to(torch.float32)


def test_rotary_embeddings_and_conversions_to_the_same_dtype_stay_in_the_segment() -> None:
    torch.manual_seed(0)
    angles = torch.randn(2, 8, _HALF).repeat(1, 1, 2)
    cos, sin = angles.cos(), angles.sin()
    model = optimized(Rotary(), (torch.randn(2, 8, 32), cos, sin))
    (segment,) = segments(model)
    kinds = {type(m).__name__ for m in segment.kernels}
    assert "FusedRope" in kinds and "FusedAttention" in kinds, kinds
    run_and_compare(model, torch.randn(2, 8, 32), cos, sin)
    assert segment.replays == 1, segment.refused
    run_and_compare(model, torch.randn(2, 8, 32), sin, cos)  # other tables: read where they lie on each call


def test_a_float32_input_rounded_for_a_bf16_layer_is_a_step_of_the_replay() -> None:
    if not _C.Linear.supported("bfloat16"):
        pytest.skip("no bf16 Linear on this CPU")

    class Stream(nn.Module):
        """An fp32 value (torch's sin) read by bf16 layers: each rounds it to bf16 first."""

        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.sin(x)
            return self.b(torch.relu(self.a(h))) + h

    torch.manual_seed(0)
    model = ember.optimize(Stream().eval(), dtype=torch.bfloat16, sample_input=(torch.randn(4, 16),))
    segment = next(s for s in segments(model) if len(s.kernels) >= 2)
    x = torch.randn(4, 16)
    assert_replays_as_the_nodes_run(model, segment, x)


def test_a_channels_last_float32_input_is_rounded_where_it_lies_and_replayed() -> None:
    if not _C.Convolution.supported("bfloat16"):
        pytest.skip("no bf16 convolution on this CPU")
    x = torch.randn(2, 4, 6, 6).contiguous(memory_format=torch.channels_last)
    rounded = common.in_compute_dtype(x, True, torch.bfloat16)
    assert rounded is not None and rounded.stride() == x.stride() and torch.equal(rounded, x.to(torch.bfloat16))

    class Convs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Conv2d(4, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.relu(self.a(torch.sin(x))))  # (sin keeps the input's channels-last layout)

    torch.manual_seed(0)
    model = ember.optimize(Convs().eval(), dtype=torch.bfloat16, sample_input=(x,))
    (segment,) = segments(model)
    assert_replays_as_the_nodes_run(model, segment, x)


def test_an_input_that_requires_grad_replays_under_no_grad(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_fallback(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the graph's forward failed and the model's own ran")

    monkeypatch.setattr(GraphForward, "without_graph", no_fallback)
    torch.manual_seed(0)
    model = optimized(Encoder(), (torch.randn(2, 8, 32),))
    (segment,) = segments(model)
    run_and_compare(model, torch.randn(2, 8, 32))  # recorded from an input that does not require grad
    assert segment.replays == 1, segment.refused
    x = torch.randn(2, 8, 32, requires_grad=True)
    run_and_compare(model, x)  # the same signature: replayed, the input read as it is
    other = optimized(Encoder(), (torch.randn(2, 8, 32),))
    run_and_compare(other, x, times=4)  # recorded from one that does
    (recorded,) = segments(other)
    assert recorded.replays == 1, recorded.refused


class Windows(nn.Module):
    """Swin's data movement between its kernels: a roll and window partition (one gather of rows), arithmetic on
    sizes, and a patch merging's slices concatenated, each read by the next Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [b, 4, 4, 8]
        b = x.size(0)
        y = torch.roll(self.a(x), shifts=(1, 1), dims=(1, 2))
        windows = y.view(b, 2, 2, 2, 2, 8).permute(0, 1, 3, 2, 4, 5).contiguous().view(b * 4, 4, 8)
        z = self.b(windows).view(b, 2, 2, 2, 2, 8).permute(0, 1, 3, 2, 4, 5).reshape(b, 4, 4, 8)
        merged = torch.cat([z[:, 0::2, 0::2], z[:, 1::2, 0::2], z[:, 0::2, 1::2], z[:, 1::2, 1::2]], -1)
        return self.c(merged)


def test_a_gather_of_rows_a_cat_and_size_arithmetic_are_steps_of_the_replay() -> None:
    torch.manual_seed(0)
    model = optimized(Windows(), (torch.randn(2, 4, 4, 8),))
    (segment,) = segments(model)
    kinds = {type(k).__name__ for k in segment.kernels}
    assert "FusedRearrangement" in kinds
    run_and_compare(model, torch.randn(2, 4, 4, 8), times=3)
    assert segment.replays == 1, segment.refused
    assert_replays_as_the_nodes_run(model, segment, torch.randn(2, 4, 4, 8))
    run_and_compare(model, torch.randn(3, 4, 4, 8), times=3)  # another batch: its own recording
    assert segment.replays == 2, segment.refused


class TableBias(Encoder):
    """An encoder whose attention adds a bias gathered from a table of the model's (Swin's relative positions): a
    weight transform, kept between calls and read by the attention's kernel as its mask."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(15, 4))
        self.register_buffer("index", torch.randint(0, 15, (8, 8)))
        self.embed = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)  # (a kernel first: the bias is read inside the run, not passed in)
        bias = self.table[self.index].permute(2, 0, 1).unsqueeze(0)  # [1, heads, 8, 8]
        return self.layer(x, bias)


def test_a_weight_transform_read_in_the_segment_is_checked_on_each_call() -> None:
    torch.manual_seed(0)
    model = optimized(TableBias(), (torch.randn(2, 8, 32),))
    (segment,) = segments(model)
    assert any(isinstance(m, FoldedConstant) for m in segment.graph_module.modules())  # read inside the segment
    x = torch.randn(2, 8, 32)
    run_and_compare(model, x, times=3)
    assert segment.replays == 1, segment.refused
    with torch.no_grad():
        model.table.mul_(2.0)  # the parameter the optimized model shares: its bias must be gathered anew
        model._reference.table.mul_(2.0)  # type: ignore[union-attr]
    run_and_compare(model, x, times=4)
    assert segment.replays == 1, segment.refused
    assert_replays_as_the_nodes_run(model, segment, x)


class ShiftedBlock(nn.Module):
    """torchvision's Swin between two projections: q scaled, the scores plus a relative-position bias, each window's
    mask (computed from positions) added through views (gathered into one mask by attention_mask.py), then a pad of
    the result by nothing, its sizes from the input's (kept in the graph: a pass cannot tell it pads nothing)."""

    def __init__(self, heads: int = 2, length: int = 8, features: int = 4) -> None:
        super().__init__()
        self.heads, self.length, self.features = heads, length, features
        self.qkv = nn.Linear(heads * features, 3 * heads * features)
        self.proj = nn.Linear(heads * features, heads * features)
        # the relative-position bias gathered from a table (a weight transform, kept: fold_constants.py)
        self.table = nn.Parameter(torch.randn(2 * length - 1, heads))
        positions = torch.arange(length)
        self.register_buffer("index", positions[None, :] - positions[:, None] + length - 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [b * 4 windows, length, channels]
        n, length, channels = x.shape[0], x.shape[1], x.shape[2]
        qkv = self.qkv(x).reshape(n, length, 3, self.heads, self.features).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        bias = self.table[self.index].permute(2, 0, 1)  # [heads, length, length]
        attn = (q * self.features**-0.5) @ k.transpose(-2, -1) + bias.unsqueeze(0)
        windows = 4  # each window's mask from sizes alone, as torchvision builds it (kept per signature)
        regions = x.new_zeros((windows, length))
        regions[1:, length // 2 :] = 1.0
        mask = regions.unsqueeze(1) - regions.unsqueeze(2)
        mask = mask.masked_fill(mask != 0, -100.0)
        attn = attn.view(n // windows, windows, self.heads, length, length) + mask.unsqueeze(1).unsqueeze(0)
        attn = attn.view(-1, self.heads, length, length).softmax(dim=-1)
        out = (attn @ v).transpose(1, 2).reshape(n, length, channels)
        pad = (length - length % length) % length  # 0, computed from a size
        return self.proj(F.pad(self.proj(out), (0, 0, 0, pad)))


@pytest.mark.skipif(not HAS_EXPORT_AUTO, reason="captured by torch.export (a window mask written in place)")
def test_swins_shifted_window_attention_replays_as_one_segment() -> None:
    torch.manual_seed(0)
    model = optimized(ShiftedBlock(), (torch.randn(8, 8, 8),))
    (segment,) = segments(model)
    assert len(segment.kernels) == 4  # qkv, the attention (its queries' scaling in its scale), both projections
    run_and_compare(model, torch.randn(8, 8, 8), times=3)
    assert segment.replays == 1, segment.refused
    assert_replays_as_the_nodes_run(model, segment, torch.randn(8, 8, 8))
    run_and_compare(model, torch.randn(12, 8, 8), times=3)  # three images of 4 windows: a signature of its own


class Pools(nn.Module):
    """A CNN's pools and a pre-activation BatchNorm (DenseNet's: after a cat, so no layer takes it in) between its
    convolutions: each a kernel of ember's, each a step of the replay."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.branch = nn.Conv2d(8, 8, 1)
        self.norm = nn.BatchNorm2d(16)
        self.conv = nn.Conv2d(16, 8, 3, padding=1)
        self.head = nn.Linear(8, 5)
        with torch.no_grad():
            self.norm.running_mean.uniform_(-0.5, 0.5)
            self.norm.running_var.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.stem(x)), 2)
        x = torch.cat([x, self.branch(x)], 1)
        x = F.avg_pool2d(self.conv(F.relu(self.norm(x))), 2)
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


def test_pools_and_a_batch_norm_are_steps_of_the_replay() -> None:
    torch.manual_seed(0)
    model = optimized(Pools(), (torch.randn(2, 3, 16, 16),))
    (segment,) = segments(model)
    kinds = [type(k).__name__ for k in segment.kernels]
    assert {"FusedMaxPool", "FusedAvgPool", "FusedAdaptiveAvgPool", "FusedBatchNorm"} <= set(kinds), kinds
    x = torch.randn(2, 3, 16, 16)
    run_and_compare(model, x, times=3)
    assert segment.replays == 1, segment.refused
    assert_replays_as_the_nodes_run(model, segment, x)
    with torch.no_grad():  # statistics changed in place: read where they live
        for norm in (model.norm, model._reference.norm):  # type: ignore[union-attr]
            norm.running_mean.add_(0.25)
    run_and_compare(model, x, times=2)
    replaced = torch.nn.Parameter(torch.rand(16) + 0.5)
    model.norm.weight = replaced  # a parameter replaced: the replay's check sees it and the segment records again
    model._reference.norm.weight = torch.nn.Parameter(replaced.detach().clone())  # type: ignore[union-attr]
    run_and_compare(model, x, times=4)
    assert segment.replays == 1, segment.refused


@pytest.mark.parametrize("mode", ["constant", "reflect"])
def test_a_pad_is_a_zeroed_border_and_a_copy(mode: str) -> None:
    """A constant pad between two kernels: its border zeroed and its input copied inside, as steps; a reflecting pad
    has no step, and the segment says so."""

    class Padding(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.a(x)  # [2, 5, 8]
            return self.b(F.pad(y.transpose(1, 2), (1, 2), mode=mode).transpose(1, 2).contiguous())

    torch.manual_seed(0)
    model = optimized(Padding(), (torch.randn(2, 5, 8),))
    (segment,) = segments(model)
    run_and_compare(model, torch.randn(2, 5, 8), times=3)
    if mode == "constant":
        assert segment.replays == 1, segment.refused
        assert_replays_as_the_nodes_run(model, segment, torch.randn(2, 5, 8))
    else:
        assert segment.replays == 0 and "outside the kernels" in str(segment.refused)


class BiasComputedFirst(TableBias):
    """A weight transform computed before the first kernel and read, with sizes, by a mask built after it (a value
    kept per signature that depends on the transform): a replay must see the transform change."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.table[self.index].permute(2, 0, 1).unsqueeze(0)  # [1, heads, 8, 8], before any kernel
        x = self.embed(x)
        mask = bias + x.new_zeros((1, 1, x.shape[1], x.shape[1]))  # from the bias and sizes alone
        return self.layer(x, mask)


def test_a_weight_transform_computed_before_the_segment_is_checked_too() -> None:
    torch.manual_seed(0)
    model = optimized(BiasComputedFirst(), (torch.randn(2, 8, 32),))
    (segment,) = segments(model)
    x = torch.randn(2, 8, 32)
    run_and_compare(model, x, times=3)
    assert segment.replays == 1, segment.refused
    with torch.no_grad():
        model.table.mul_(2.0)
        model._reference.table.mul_(2.0)  # type: ignore[union-attr]
    run_and_compare(model, x, times=4)
