"""The order graph mode runs its passes in, one home for every caller (``ember.optimize``'s graph mode and the
``torch.compile`` backend). Each pass is a module of this package, with its own tests:

0. :mod:`remove_identities`: eval-mode dropout, ``nn.Identity`` and torch.export's dtype asserts;
   :mod:`recognize_gelu`: the tanh GELU written out as arithmetic (GPT-2's) as the one call it is, for the
   epilogue pass to fuse; :mod:`recognize_quick_gelu`: ``x * sigmoid(c * x)`` (CLIP's) as a SiLU between
   two scales, a chain the epilogue pass fuses; :mod:`fold_constants`: weight transforms computed from the
   model's tensors alone, kept rather than computed per call (a layer whose weight is one is then lowered);
1. :mod:`lower`: every Linear, convolution and constant-weight matmul onto a fused node on ember's kernels;
   :mod:`lower_multihead`: each ``nn.MultiheadAttention`` call onto ember's Linear and attention kernels;
2. :mod:`fold_batchnorm`: BatchNorms into the layer before them; :mod:`fold_scales`: a per-channel factor of the
   model's (a layer scale) into the Linear before it, through a permutation; :mod:`lower_pooling`: max and average
   pools onto ember's kernels, a ReLU before a max pool taken in (before the epilogue pass would give it to the
   convolution);
   :mod:`lower_batchnorm`: the BatchNorms left (pre-activation ones) onto ember's per-channel kernel, a ReLU after
   one taken in;
3. :mod:`fuse_epilogue`: activations, constant multiply-adds and a residual add into the layer's epilogue (a
   residual add that joins a layer's epilogue is one fewer pass over memory than the same add joining a norm),
   through a reshape or a permutation of a Linear's output;
   :mod:`lower_products`: a squeeze-excitation's ``x * scale`` onto ember's kernel;
4. :mod:`merge_linears`: Linears that read one input (Q, K, V) as one GEMM, where that costs no memory;
5. :mod:`fuse_norm`: LayerNorm and RMSNorm in any spelling, with the residual add before them (after the merge, so
   that a norm whose result the merged projection reads in bf16 writes it once in bf16);
6. :mod:`fuse_rope`: the rotate-half rotary embedding of queries and keys onto ember's kernel;
7. :mod:`fuse_attention`: ``F.scaled_dot_product_attention`` and the written-out matmul - scale - mask - softmax -
   matmul onto ember's flash-attention kernel;
8. :mod:`absorb_casts`: a conversion to float32 that only bf16 layers read, as their input, taken into them (T5's
   ``h.to(self.wo.weight.dtype)``: two passes over the activation that give back what they read);
9. :mod:`common_subexpressions`: a pure operation repeated on the same operands computed once (T5's per-layer
   mask and position bias);
10. :mod:`shape_values`: tensors computed from the inputs' sizes alone (masks built from positions, Swin's window
    masks and the mask gathered from them) kept per input signature instead of computed on every call;
11. :mod:`remove_dead_code`: pure operations whose results nothing reads;
12. :mod:`gather_rearrangements`: a chain of data-movement operations that copies twice or more (Swin's rolled
    window partition and its reverse) as one gather of rows;
13. :mod:`views_as_methods`: torch.export's view operations called as tensor methods (cheaper calls);
    :mod:`channels_last_1d`: 1-D convolutions read and write channels-last where no reader needs torch's layout;
14. :mod:`replay_segments`: each run of fused nodes and the views between them as one segment, whose kernel calls
    are recorded once per input signature and replayed in one call (:mod:`replay`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import fx

from ember._optimize.graph.absorb_casts import absorb_casts
from ember._optimize.graph.accumulate_in_place import accumulate_residuals_in_place
from ember._optimize.graph.channels_last_1d import channels_last_1d
from ember._optimize.graph.common_subexpressions import eliminate_common_subexpressions
from ember._optimize.graph.fold_batchnorm import fold_batchnorms
from ember._optimize.graph.fold_constants import fold_constants
from ember._optimize.graph.fold_scales import fold_scales
from ember._optimize.graph.fuse_attention import fuse_attention
from ember._optimize.graph.fuse_epilogue import fuse_epilogues
from ember._optimize.graph.fuse_norm import fuse_norms
from ember._optimize.graph.fuse_rope import fuse_rope
from ember._optimize.graph.gather_rearrangements import gather_rearrangements
from ember._optimize.graph.lower import lower_layers
from ember._optimize.graph.lower_batchnorm import lower_batchnorms
from ember._optimize.graph.lower_multihead import lower_multihead_attention
from ember._optimize.graph.lower_pooling import lower_pooling
from ember._optimize.graph.lower_products import lower_products
from ember._optimize.graph.merge_linears import merge_linears
from ember._optimize.graph.recognize_gelu import recognize_gelu
from ember._optimize.graph.recognize_quick_gelu import recognize_quick_gelu
from ember._optimize.graph.refs import TensorOperands
from ember._optimize.graph.remove_dead_code import remove_dead_code
from ember._optimize.graph.remove_identities import remove_identities
from ember._optimize.graph.replay_segments import replay_segments
from ember._optimize.graph.shape_values import cache_shape_values
from ember._optimize.graph.views_as_methods import views_as_methods


@dataclass(frozen=True)
class PassCounts:
    """What the passes did to one graph, for the report."""

    removed: int
    gelus: int
    quick_gelus: int
    constants: int
    lowered: list[str]
    multihead: int
    folded: int
    pools: int
    pool_relus: int
    batchnorms: int
    batchnorm_relus: int
    fused: int
    merged: int
    norms: int
    rotary: int
    attention: int
    casts: int
    shared: int
    shape_values: int
    dead: int
    in_place: int
    rearranged: int
    replayed: int
    products: int
    scales: int
    layouts_1d: int

    def describe(self) -> str:
        """What the passes did, in one line: each count that is not zero (the layers always)."""
        said = [
            (len(self.lowered), "layer(s) on ember's kernels"),
            (self.folded, "BatchNorm(s) folded into them"),
            (self.pools, f"pool(s) on ember's kernels ({self.pool_relus} max pool(s) with the ReLU before them in)"),
            (self.batchnorms, f"BatchNorm(s) on ember's kernel ({self.batchnorm_relus} with the ReLU after them)"),
            (self.fused, "elementwise operation(s) fused into their epilogues"),
            (self.merged, "Linear(s) merged into the GEMM of another reading their input"),
            (self.norms, "norm(s) on ember's kernel"),
            (self.rotary, "rotary embedding(s) on ember's kernel"),
            (self.attention, "attention(s) on ember's flash-attention kernel"),
            (self.removed, "eval-mode identity(s) removed"),
            (self.gelus, "written-out tanh GELU(s) recognized"),
            (self.quick_gelus, "written-out quick GELU(s) recognized"),
            (self.constants, "weight transform(s) folded"),
            (self.casts, "conversion(s) to float32 taken into the bf16 layers reading them"),
            (self.shared, "repeated computation(s) shared"),
            (self.shape_values, "reader(s) of values computed from the inputs' sizes alone given them kept"),
            (self.dead, "unread operation(s) removed"),
            (self.multihead, "nn.MultiheadAttention call(s) on ember's kernels"),
            (self.in_place, "residual add(s) made in place"),
            (self.rearranged, "chain(s) of data movement run as one gather"),
            (self.replayed, "fused node(s) in segments replayed in one call"),
            (self.products, "squeeze-excitation product(s) on ember's kernel"),
            (self.scales, "scale(s) folded into the Linears before them"),
            (self.layouts_1d, "1-D convolution(s) channels-last"),
        ]
        return ", ".join(f"{count} {what}" for index, (count, what) in enumerate(said) if count or index == 0)


def run_passes(gm: fx.GraphModule, operands: TensorOperands, compute: torch.dtype, replay: bool = True) -> PassCounts:
    """Runs every pass on ``gm`` in order (the lowering lowers only what ember's kernels take in ``compute`` on this
    CPU; the passes after it act on what it lowered, and the norm and attention kernels have a path for every
    CPU). ``replay`` False leaves out the last, which moves the fused nodes into replayed segments (for tests that
    read the fused nodes in the graph itself)."""
    removed = remove_identities(gm)
    gelus = recognize_gelu(gm)
    quick_gelus = recognize_quick_gelu(gm)
    constants = fold_constants(gm, operands)
    multihead = lower_multihead_attention(gm, operands, compute)  # (before the lowering: it writes Linears out)
    lowered = lower_layers(gm, operands, compute)
    folded = fold_batchnorms(gm, operands)
    scales = fold_scales(gm, operands)  # (after the BatchNorms: a scale multiplies what a folded one gives)
    pools, pool_relus = lower_pooling(gm)
    batchnorms, batchnorm_relus = lower_batchnorms(gm, operands)
    fused = fuse_epilogues(gm)
    products = lower_products(gm)  # (after the epilogue pass: the excitation's activation is in its convolution)
    merged = merge_linears(gm, operands)
    norms = fuse_norms(gm, operands)
    rotary = fuse_rope(gm)
    attention = fuse_attention(gm)
    casts = absorb_casts(gm)
    shared = eliminate_common_subexpressions(gm)
    shape_values = cache_shape_values(gm)
    dead = remove_dead_code(gm)
    rearranged = gather_rearrangements(gm)
    in_place = accumulate_residuals_in_place(gm)  # on the final graph: its order says who reads what after
    views_as_methods(gm)
    layouts_1d = channels_last_1d(gm)  # (on the final graph: who reads each convolution's output)
    replayed = replay_segments(gm) if replay else 0
    return PassCounts(
        removed,
        gelus,
        quick_gelus,
        constants,
        lowered,
        multihead,
        folded,
        pools,
        pool_relus,
        batchnorms,
        batchnorm_relus,
        fused,
        merged,
        norms,
        rotary,
        attention,
        casts,
        shared,
        shape_values,
        dead,
        in_place,
        rearranged,
        replayed,
        products,
        scales,
        layouts_1d,
    )
