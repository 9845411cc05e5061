"""1-D convolutions channels-last where the graph allows it: a fused 1-D convolution reads and writes [N, C, W] with
unit stride along C (a transposed dense [N, W, C]), where oneDNN runs its fast implementations; in torch's
contiguous [N, C, W] it ran its im2col GEMM (Whisper's two convolutions and Wav2Vec2's feature encoder: 1.3-1.9x
slower on the Zen 5; for one input channel, Wav2Vec2's first, its only channels-last implementation is the
reference one, and that convolution stays as it was). torch's Conv1d returns contiguous tensors, and ``.view`` on
one is common, so the layout changes only where every reader of the convolution's output takes any strides: not a
``view`` (which fails on them), not the graph's output (the caller may view it), not a module of the model's that
tracing kept whole. Another channels-last convolution then reads the output as it is, and a permutation to
[N, W, C] after the last one (Whisper's encoder, Wav2Vec2's feature projection) is a contiguous tensor for free,
where it had been a transposed one the next norm copied.

Runs on the final graph (after the epilogue pass has taken each convolution's activation in), before the replay.
"""

from __future__ import annotations

import dataclasses

from torch import fx

from ember._graph.ops import movement_of
from ember._optimize.graph.nodes import FusedConv
from ember._optimize.graph.refs import module_of


def channels_last_1d(gm: fx.GraphModule) -> int:
    """Lays out every 1-D convolution the rule above allows channels-last; returns how many."""
    changed = 0
    for node in gm.graph.nodes:
        conv = module_of(node, gm)
        if not isinstance(conv, FusedConv) or len(conv.geometry.stride) != 1 or conv.geometry.transposed:
            continue
        if _in_channels(conv) == 1:
            continue  # one input channel: oneDNN has only its reference convolution for a channels-last output
        if conv.geometry.channels_last_1d or not node.users or not all(_takes_any_strides(u, gm) for u in node.users):
            continue
        conv.geometry = dataclasses.replace(conv.geometry, channels_last_1d=True)
        changed += 1
    return changed


def _in_channels(conv: FusedConv) -> int | None:
    """The convolution's input channels (None where the graph passes its weight and none is known yet)."""
    try:
        weight = conv.state.weight()
    except TypeError:
        return None
    return int(weight.shape[1]) * conv.geometry.groups


def _takes_any_strides(user: fx.Node, gm: fx.GraphModule) -> bool:
    """Whether ``user`` computes the same from a tensor of any strides: any function or method but a view, and any
    module of torch's own or of ember's (a module of the model's that tracing kept whole may view its input)."""
    if user.op == "output" or movement_of(user) in ("view", "_unsafe_view"):
        return False
    module = module_of(user, gm)
    return module is None or type(module).__module__.startswith(("torch.nn.", "ember."))
