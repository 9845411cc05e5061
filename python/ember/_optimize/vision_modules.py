"""torchvision's detection ops onto ember's kernels: ``torchvision.ops.FrozenBatchNorm2d`` modules become
``ember.nn.FrozenBatchNorm2d`` (RoIAlign follows when it exists).

Only the class changes: the module keeps its buffers, eps and state_dict keys (the two classes hold the same
state). The test is on the class's module path and name, so torchvision is never imported here; subclasses are
left alone, since their forward may do something else.
"""

from __future__ import annotations

from torch import nn

from ember.nn.frozen_batch_norm import FrozenBatchNorm2d

_TORCHVISION_FROZEN_BN = ("torchvision.ops.misc", "FrozenBatchNorm2d")


def use_ember_vision_ops(model: nn.Module) -> int:
    """Swaps the classes; returns how many modules changed."""
    swapped = 0
    for module in model.modules():
        kind = type(module)
        if (kind.__module__, kind.__name__) == _TORCHVISION_FROZEN_BN:
            module.__class__ = FrozenBatchNorm2d
            swapped += 1
    return swapped
