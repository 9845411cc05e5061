"""torchvision's detection ops onto ember's kernels: ``torchvision.ops.FrozenBatchNorm2d`` and ``RoIAlign`` modules
become ``ember.nn.FrozenBatchNorm2d`` and ``ember.nn.RoIAlign``.

Only the class changes: the module keeps its buffers, settings and state_dict keys (each pair of classes holds the
same state). The test is on the class's module path and name, so torchvision is never imported here; subclasses are
left alone, since their forward may do something else.
"""

from __future__ import annotations

from torch import nn

from ember.nn.frozen_batch_norm import FrozenBatchNorm2d
from ember.nn.vision import RoIAlign

_REPLACEMENTS: dict[tuple[str, str], type[nn.Module]] = {
    ("torchvision.ops.misc", "FrozenBatchNorm2d"): FrozenBatchNorm2d,
    ("torchvision.ops.roi_align", "RoIAlign"): RoIAlign,
}


def use_ember_vision_ops(model: nn.Module) -> int:
    """Swaps the classes; returns how many modules changed."""
    swapped = 0
    for module in model.modules():
        kind = type(module)
        replacement = _REPLACEMENTS.get((kind.__module__, kind.__name__))
        if replacement is not None:
            module.__class__ = replacement
            swapped += 1
    return swapped
