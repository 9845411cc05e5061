"""MultiStreamModule: one model, its batch split across streams that each run on their own CPUs."""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch import nn

from ember.runtime.cpu_pool import CPUPool
from ember.runtime.task import Task

__all__ = ["MultiStreamModule"]

CORES_PER_AUTO_STREAM = 4


class MultiStreamModule(nn.Module):
    """Runs ``model`` as ``num_streams`` streams: each call splits its batch (dimension 0 of every tensor argument
    whose first dimension is the batch) into one slice a stream, runs the slices concurrently, each on its own
    slice of ``cpu_pool``, and concatenates the outputs along dimension 0.

    The streams share the model's weights (one module object, no copies). A batch smaller than the stream count
    uses that many streams. Small batches on few cores each often give more throughput than one large pool,
    since small matmuls scale poorly across many threads.

    Args:
        model: the module (usually from ``ember.optimize(model.eval(), ...)``).
        num_streams: the number of streams, or ``"AUTO"``: one per 4 CPUs of the pool (at least one).
        cpu_pool: the CPUs to share out; every usable physical core by default.
        concat_output: concatenate the streams' outputs (tensors, and tuples, lists and dicts of them) along
            dimension 0. With False, a call returns the list of the streams' outputs.

    Raises:
        ValueError: for more streams than CPUs, or a num_streams that is neither a positive int nor "AUTO".
    """

    def __init__(
        self,
        model: nn.Module,
        num_streams: int | str = "AUTO",
        cpu_pool: CPUPool | None = None,
        concat_output: bool = True,
    ) -> None:
        super().__init__()
        pool = cpu_pool if cpu_pool is not None else CPUPool()
        if num_streams == "AUTO":
            num_streams = max(1, len(pool) // CORES_PER_AUTO_STREAM)
        if isinstance(num_streams, bool) or not isinstance(num_streams, int) or num_streams < 1:
            raise ValueError(f"MultiStreamModule: num_streams must be a positive int or 'AUTO', got {num_streams!r}")
        if num_streams > len(pool):
            raise ValueError(f"MultiStreamModule: {num_streams} streams need at least as many CPUs; {pool!r} has "
                             f"{len(pool)}")  # fmt: skip
        self.model = model
        self.num_streams = num_streams
        self.cpu_pool = pool
        self.concat_output = concat_output
        self.stream_pools = pool.split(num_streams)
        self._tasks = [Task(model, p) for p in self.stream_pools]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        batch = _batch_size(args, kwargs)
        if batch is None:
            raise ValueError("MultiStreamModule: no tensor argument to split; pass the batch as a tensor")
        streams = max(1, min(self.num_streams, batch))
        sizes = [batch // streams + (i < batch % streams) for i in range(streams)]
        futures = [
            task(*_slice(args, batch, start, size), **_slice(kwargs, batch, start, size))
            for task, start, size in zip(self._tasks, itertools.accumulate([0, *sizes[:-1]]), sizes)
        ]
        outputs = [f.get() for f in futures]
        return _concat(outputs) if self.concat_output else outputs

    def close(self) -> None:
        """Stops the streams' threads (also done when the module is garbage-collected)."""
        for task in self._tasks:
            task.close()

    def extra_repr(self) -> str:
        pools = ", ".join(repr(p) for p in self.stream_pools)
        return f"num_streams={self.num_streams}, stream_pools=[{pools}], concat_output={self.concat_output}"


def _batch_size(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return value.shape[0]
    return None


def _slice(value: Any, batch: int, start: int, size: int) -> Any:
    if isinstance(value, torch.Tensor):
        return value.narrow(0, start, size) if value.dim() > 0 and value.shape[0] == batch else value
    if isinstance(value, tuple):
        return tuple(_slice(v, batch, start, size) for v in value)
    if isinstance(value, list):
        return [_slice(v, batch, start, size) for v in value]
    if isinstance(value, dict):
        return {k: _slice(v, batch, start, size) for k, v in value.items()}
    return value


def _concat(outputs: list[Any]) -> Any:
    first = outputs[0]
    if len(outputs) == 1:
        return first
    if isinstance(first, torch.Tensor):
        return torch.cat(outputs, dim=0) if first.dim() > 0 else torch.stack(outputs)
    if isinstance(first, tuple) and hasattr(first, "_fields"):  # a namedtuple
        return type(first)(*(_concat([o[i] for o in outputs]) for i in range(len(first))))
    if isinstance(first, (tuple, list)):
        return type(first)(_concat([o[i] for o in outputs]) for i in range(len(first)))
    if isinstance(first, dict):
        return type(first)((k, _concat([o[k] for o in outputs])) for k in first)
    if all(o is None for o in outputs):
        return None
    raise TypeError(f"MultiStreamModule: cannot concatenate outputs of type {type(first).__name__}; "
                    "use concat_output=False to get the streams' outputs as a list")  # fmt: skip
