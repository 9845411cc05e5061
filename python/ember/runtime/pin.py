"""pin: run the calling thread, and every kernel it launches, on one CPUPool."""

from __future__ import annotations

import functools
import threading
from types import TracebackType
from typing import Any, Callable, TypeVar

import torch

from ember import _C
from ember.runtime import child_affinity
from ember.runtime.cpu_pool import CPUPool
from ember.runtime.pinned import pinned_cpus, pinned_pools

__all__ = ["pin", "pinned_cpus"]

F = TypeVar("F", bound=Callable[..., Any])


class pin:
    """Context manager and decorator: inside it, the calling thread runs on ``pool`` and so do the OpenMP threads
    its kernels use (torch's, oneDNN's and ember's), one per CPU, with ``torch.get_num_threads() == len(pool)``.

    On exit the thread's affinity, its OpenMP team's affinity and its thread count are what they were. Pins nest,
    and one ``pin`` object may be entered by several threads at once (each undoes its own).

    Only the calling thread is affected: torch's thread count is per thread, so other threads keep theirs. (MKL,
    which torch may use for fp32 matmuls, keeps its own process-wide count: ``torch.set_num_threads`` sets it.)
    A process the thread forks inside the pin runs on the whole pool (ember.runtime.child_affinity).
    """

    def __init__(self, pool: CPUPool) -> None:
        if not isinstance(pool, CPUPool):
            raise TypeError(f"pin: pool must be an ember.runtime.CPUPool, got {type(pool).__name__}")
        self.pool = pool
        self._held = threading.local()

    def __enter__(self) -> CPUPool:
        # torch sets a thread's OpenMP count on the thread's first parallel op (and would overwrite ours then):
        # get_num_threads runs that initialisation now.
        torch.get_num_threads()
        handle = _C.pin_thread(list(self.pool.core_ids))
        stack = getattr(self._held, "stack", None)
        if stack is None:
            stack = self._held.stack = []
        stack.append(handle)
        pinned_pools().append(tuple(self.pool.core_ids))
        child_affinity.register()
        return self.pool

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        pinned_pools().pop()
        _C.unpin_thread(self._held.stack.pop())

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def pinned(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return pinned  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"pin({self.pool!r})"
