"""Task: a function or module run asynchronously on a thread pinned to its own CPUPool."""

from __future__ import annotations

import concurrent.futures
import itertools
import queue
import threading
import weakref
from typing import Any, Callable

import torch

from ember.runtime.cpu_pool import CPUPool
from ember.runtime.pin import pin

__all__ = ["Task", "TaskFuture"]

_STOP = object()
_task_ids = itertools.count()


def _stop(calls: queue.SimpleQueue[Any], thread: threading.Thread) -> None:
    calls.put(_STOP)
    if threading.current_thread() is not thread:
        thread.join()


class TaskFuture(concurrent.futures.Future[Any]):
    """The result of one call of a :class:`Task`: a ``concurrent.futures.Future`` with IPEX's ``get()``."""

    def get(self, timeout: float | None = None) -> Any:
        """Waits for the call and returns its result (or raises its exception)."""
        return self.result(timeout)


def _serve(calls: queue.SimpleQueue[Any], fn: Callable[..., Any], pool: CPUPool) -> None:
    with pin(pool):
        while True:
            item = calls.get()
            if item is _STOP:
                return
            future, args, kwargs, grad, inference = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                # Autograd's modes are per thread: run as the submitting thread would have.
                with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                    result = fn(*args, **kwargs)
            except BaseException as error:
                future.set_exception(error)
            else:
                future.set_result(result)
            del item, future, args, kwargs


class Task:
    """Runs ``fn`` (a function or an ``nn.Module``) on a thread of its own, pinned to ``cpu_pool``.

    Calling the task submits a call and returns a :class:`TaskFuture` at once; calls run one after another, in
    submission order, on the task's thread, while the caller goes on (ember's and torch's kernels release the
    GIL). Several tasks on disjoint pools run concurrently. The caller's autograd mode (``no_grad``,
    ``inference_mode``) goes with each call.

    ``close()`` (or leaving a ``with Task(...)`` block) lets the submitted calls finish and stops the thread.

    Args:
        fn: what to run.
        cpu_pool: the CPUs it runs on; its kernels use ``len(cpu_pool)`` threads.
    """

    def __init__(self, fn: Callable[..., Any], cpu_pool: CPUPool) -> None:
        if not callable(fn):
            raise TypeError(f"Task: fn must be callable (a function or an nn.Module), got {type(fn).__name__}")
        if not isinstance(cpu_pool, CPUPool):
            raise TypeError(f"Task: cpu_pool must be an ember.runtime.CPUPool, got {type(cpu_pool).__name__}")
        self.fn = fn
        self.cpu_pool = cpu_pool
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(
            target=_serve, args=(self._calls, fn, cpu_pool), name=f"ember-task-{next(_task_ids)}", daemon=True
        )
        self._thread.start()
        # A task dropped without close(), or alive at exit, still stops its thread (which holds no reference to the
        # task), and at exit waits for it: a thread still unwinding its pin while the interpreter shuts down would
        # be cut off mid-way.
        self._finalizer = weakref.finalize(self, _stop, self._calls, self._thread)

    def __call__(self, *args: Any, **kwargs: Any) -> TaskFuture:
        if self._closed:
            raise RuntimeError("Task: called after close()")
        future = TaskFuture()
        self._calls.put((future, args, kwargs, torch.is_grad_enabled(), torch.is_inference_mode_enabled()))
        return future

    def run_sync(self, *args: Any, **kwargs: Any) -> Any:
        """Submits one call and waits for its result."""
        return self(*args, **kwargs).get()

    def close(self) -> None:
        """Finishes the calls already submitted, then stops the task's thread. Idempotent."""
        if not self._closed:
            self._closed = True
            self._finalizer()

    def __enter__(self) -> Task:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Task({getattr(self.fn, '__name__', type(self.fn).__name__)}, {self.cpu_pool!r})"
