"""bfloat16 conversion: rounding, and the split-BF16 form of fp32 master weights.

This package is the one home of split-BF16: the conversions (``conversion``), the master weights an optimizer
keeps as bottom halves beside bf16 parameters (``master_weights``), and the checkpoint hooks that give a model's
``state_dict`` its exact fp32 values (``checkpoints``).

``split(x)`` stores an fp32 tensor as two 16-bit halves: ``top``, a ``torch.bfloat16`` tensor a model can compute
with, and ``bottom``, a ``torch.int16`` tensor of the remaining bits. ``join(top, bottom)`` gives back ``x`` bit for
bit, for every fp32 bit pattern (NaN payloads, infinities, denormals, -0.0). That is how ember trains in bf16
without a second fp32 copy of the weights.

``top`` is *truncated*, not rounded. No reversible split can keep every NaN a NaN in ``top`` (2^23-1 NaNs per sign
share 127 bf16 NaN tops with 2^16 bottoms each); truncation loses the fewest (only signalling NaNs whose payload
lies wholly in the low 16 bits get an infinite ``top``), never turns a finite value infinite, keeps the sign, and
costs a shift. Rounding would carry some NaNs into the sign bit (NaN -> -0.0). ``top`` is then within one bf16 ulp
of ``x`` (rounding: half an ulp); the optimizer updates the full fp32 value, so the bias does not accumulate.

``round(x)`` converts to bf16 with round-to-nearest-even, like ``x.to(torch.bfloat16)``, denormals included. A NaN
stays NaN with its sign and top payload bits and the quiet bit set (torch returns one canonical NaN instead).

New outputs keep the memory layout of a dense input (a channels-last tensor gives channels-last halves); other
inputs are copied to a contiguous tensor first. ``out`` tensors, when given, must be contiguous, of the right
dtype and shape, and not overlap the inputs (the inputs are then made contiguous). These functions do not record
autograd history.
"""

from ember.bf16.conversion import join, round, split  # noqa: A004 - round is this module's name for it

__all__ = ["join", "round", "split"]
