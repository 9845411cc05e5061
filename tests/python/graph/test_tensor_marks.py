"""``_C.TensorMarks``, the graph guard's check of every fused layer's tensors in one call (``fast_calls.GraphGuard``):
a layer passes only where each tensor is the very one its cache marked, at the same version and data pointer, and
the cache has marked nothing since; any other layer is reported for the Python comparison to decide. Each case here
against that comparison (``fast_calls._unchanged``), which the check must never be more lenient than."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
import torch
from graphs import graph_forward
from torch import nn

import ember
from ember import _C
from ember._optimize.graph import fast_calls
from ember._optimize.inference.state import CachedKernel, TensorRef


class Scaled(nn.Module):
    """A weight, no bias, a buffer, and a tensor read through a property (in neither registry)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 3))
        self.register_parameter("bias", None)
        self.register_buffer("stats", torch.randn(4))
        self._hidden = torch.randn(4)

    @property
    def gain(self) -> torch.Tensor:
        return self._hidden


NAMES = ("weight", "bias", "stats", "gain")


def _layer(module: Scaled) -> tuple[CachedKernel, tuple[TensorRef, ...]]:
    refs = tuple(TensorRef(module, name) for name in NAMES)
    cache = CachedKernel()
    cache.track(tuple(ref.get() for ref in refs))
    return cache, refs


def _marks_of(*layers: tuple[CachedKernel, tuple[TensorRef | None, ...]]) -> Any:
    marks = _C.TensorMarks()
    for cache, refs in layers:
        marks.add(cache, list(refs))
    return marks


def _agrees(marks: Any, layers: list[tuple[CachedKernel, tuple[TensorRef, ...]]], epoch: int) -> list[int]:
    """The layers the check reports, after asserting that it passes exactly those the Python comparison passes
    (for layers whose caches marked nothing since the check was made) and stamps only those."""
    for cache, _ in layers:
        cache.checked = -1
    reported = marks.check(epoch)
    for i, (cache, refs) in enumerate(layers):
        assert (i not in reported) == fast_calls._unchanged(cache, refs)
        assert (cache.checked == epoch) == (i not in reported)
    return reported


def test_unchanged_layers_pass_and_are_stamped() -> None:
    layers = [_layer(Scaled()), _layer(Scaled())]
    marks = _marks_of(*layers)
    assert len(marks) == 2
    assert _agrees(marks, layers, 7) == []
    assert _agrees(marks, layers, 8) == []


def _bump(m: Scaled) -> None:
    with torch.no_grad():
        m.weight.mul_(2)


def _replace(m: Scaled) -> None:
    m.weight = nn.Parameter(torch.randn(4, 3))


def _repoint(m: Scaled) -> None:
    m.weight.data = torch.randn(4, 3)  # no version bump: the data pointer tells


def _buffer(m: Scaled) -> None:
    m.stats.add_(1)


def _new_buffer(m: Scaled) -> None:
    m.stats = torch.randn(4)


def _bias_given(m: Scaled) -> None:
    m.bias = nn.Parameter(torch.randn(4))


def _property(m: Scaled) -> None:
    m._hidden = torch.randn(4)


@pytest.mark.parametrize(
    "change", [_bump, _replace, _repoint, _buffer, _new_buffer, _bias_given, _property], ids=lambda f: f.__name__[1:]
)
def test_a_change_reports_its_layer_alone(change: Any) -> None:
    modules = [Scaled(), Scaled(), Scaled()]
    layers = [_layer(m) for m in modules]
    marks = _marks_of(*layers)
    change(modules[1])
    assert _agrees(marks, layers, 3) == [1]


def test_a_parameter_put_back_after_its_cache_marked_another_is_reported() -> None:
    """The check copied the marks of weight A. The layer then saw weight B (its cache marked B and built for it),
    and A came back: the tensors match the copy, but the cache's kernel is B's. The cache's marks are no longer the
    tuple the check copied, so the layer is reported, and the Python comparison (against B) drops B's kernel."""
    module = Scaled()
    cache, refs = _layer(module)
    marks = _marks_of((cache, refs))
    first = module.weight
    module.weight = nn.Parameter(torch.randn(4, 3))
    cache.track(tuple(ref.get() for ref in refs))
    module.weight = first
    assert marks.check(1) == [0]
    assert not fast_calls._unchanged(cache, refs)


def test_a_freed_tensor_is_never_taken_for_a_new_one() -> None:
    """A replaced weight freed: its weakref is dead, whatever address the new one has."""
    module = Scaled()
    layers = [_layer(module)]
    marks = _marks_of(*layers)
    module.weight = nn.Parameter(torch.randn(4, 3))
    gc.collect()
    assert _agrees(marks, layers, 2) == [0]


def test_inference_tensors_have_no_version_to_compare() -> None:
    """As the Python comparison: an inference tensor changed in place keeps its data pointer and has no version
    counter; it passes (what inference mode promises is that nothing outside it sees the change)."""
    with torch.inference_mode():
        module = Scaled()
        layers = [_layer(module)]
        marks = _marks_of(*layers)
        module.stats.add_(1)
    assert _agrees(marks, layers, 4) == []


def test_sources_that_do_not_match_the_marks_are_reported() -> None:
    module = Scaled()
    cache, refs = _layer(module)
    marks = _marks_of((cache, refs[:2]))  # two sources for four marks
    assert marks.check(1) == [0]
    empty = CachedKernel()  # marked nothing yet
    assert _marks_of((empty, refs)).check(1) == [0]


def test_a_failing_read_reports_the_layer_and_leaves_no_error() -> None:
    class Broken(Scaled):
        @property
        def gain(self) -> torch.Tensor:
            if getattr(self, "broken", False):
                raise RuntimeError("gone")
            return self._hidden

    module = Broken()
    layers = [_layer(module), _layer(Scaled())]
    marks = _marks_of(*layers)
    module.broken = True
    assert marks.check(5) == [0]
    assert layers[1][0].checked == 5


def test_the_guard_makes_its_copy_again_only_after_a_change() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
    x = torch.randn(2, 3)
    optimized = ember.optimize(model, dtype=torch.float32, graph_mode=True, sample_input=(x,))
    guard = graph_forward(optimized).guard()
    with torch.no_grad():
        optimized(x)
        optimized(x)
        kept = guard._marks
        assert kept is not None and len(kept) == 2
        optimized(x)
        assert guard._marks is kept  # kept while nothing changes
        model[0].weight.mul_(2)
        torch.testing.assert_close(optimized(x), model(x))  # seen, and the layer rebuilt
        optimized(x)
        assert guard._marks is not kept and guard._marks is not None
        again = guard._marks
        optimized(x)
        assert guard._marks is again


def test_a_model_whose_root_owns_a_fused_weight_is_freed() -> None:
    """The check's copy holds the layer's cache and where its tensors live, here the root module itself: the
    garbage collector must see through it, or the model and its graph would never be freed."""
    model = nn.Linear(8, 8).eval()
    x = torch.randn(2, 8)
    optimized = ember.optimize(model, dtype=torch.float32, graph_mode=True, sample_input=(x,))
    with torch.no_grad():
        for _ in range(3):
            optimized(x)
    assert graph_forward(optimized).guard()._marks is not None
    gone = weakref.ref(optimized)
    del model, optimized
    gc.collect()
    assert gone() is None
