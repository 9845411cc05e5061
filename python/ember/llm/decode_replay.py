"""The decode step replayed: for each batch size, the kernel calls of one step (every layer, the final norm, the LM
head) recorded on its first step (ops.Recording) and run from then on in one C++ call (``ember._C.Replay``), on
that step's hidden states, rotary tables and logits, against the cache it is given.

A replay stands for a step when the step is what it recorded: one new token for each of the same number of
sequences, none of them padding, continuing sequences already in the cache, the logits of that token only, and
nothing else asked of the forward (hidden states). The operands' sizes are fixed by the batch size alone (the cache's
lengths are read by the attention at run time), so one recording serves every step of every generation of that
batch size. A step whose calls cannot be recorded (a layer torch's matmul serves, at some fp32 shapes) leaves that
batch size to the call-by-call forward.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import torch

from ember import _C
from ember._tensor import dlpack
from ember.llm import ops
from ember.llm.cache import KVCacheBase

# Batch sizes a decoder keeps a replay for (a server decodes at a handful at a time).
_KEPT = 8


class DecodeReplays:
    """A decoder's replays, one per batch size."""

    def __init__(self) -> None:
        self._replays: dict[int, _C.Replay | None] = {}  # batch -> replay (None: its calls cannot be recorded)
        self._lock = threading.Lock()  # one replay's buffers serve one step at a time
        self.enabled = True  # (False: every step call by call)

    def run(
        self,
        step: Callable[[ops.Calls, torch.Tensor], torch.Tensor],
        inputs: Sequence[torch.Tensor],
        logits: torch.Tensor,
        cache: KVCacheBase,
    ) -> torch.Tensor:
        """``step(calls, logits)`` (the decoder's step on those calls, writing ``logits``) for the batch of
        ``logits``: replayed on ``inputs`` (the step's hidden states and rotary tables) and ``logits`` where a
        recording of this batch size exists, else recorded now (or run call by call where it cannot be)."""
        batch = logits.shape[0]
        if not self._lock.acquire(blocking=False):  # another thread is replaying: this step runs call by call
            return step(ops.Calls(), logits)
        try:
            if batch not in self._replays:
                return self._record(step, inputs, logits, cache)
            replay = self._replays[batch]
            if replay is None:
                return step(ops.Calls(), logits)
            replay.run([*map(dlpack, inputs), dlpack(logits)], cache.paged)
            return logits
        finally:
            self._lock.release()

    def _record(
        self,
        step: Callable[[ops.Calls, torch.Tensor], torch.Tensor],
        inputs: Sequence[torch.Tensor],
        logits: torch.Tensor,
        cache: KVCacheBase,
    ) -> torch.Tensor:
        batch = logits.shape[0]
        recording = ops.Recording([*inputs, logits])
        try:
            step(recording, logits)
        except ops.NotRecordable:
            # The layers before the call that could not be recorded wrote their keys already: the step starts over,
            # call by call, writing them again.
            self._keep(batch, None)
            cache.paged.cancel()
            cache.paged.begin([1] * batch)
            return step(ops.Calls(), logits)
        self._keep(batch, recording.replay)
        return logits

    def _keep(self, batch: int, replay: _C.Replay | None) -> None:
        if len(self._replays) >= _KEPT:
            self._replays.pop(next(iter(self._replays)))
        self._replays[batch] = replay
