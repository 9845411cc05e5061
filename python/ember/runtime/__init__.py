"""ember.runtime: CPU pools, pinned threads, asynchronous tasks and multi-stream inference.

Example::

    pool = ember.runtime.CPUPool(node_id=0)           # or CPUPool(core_ids=[0, 1, 2, 3])
    with ember.runtime.pin(pool):                     # this thread and its kernels on those CPUs only
        y = model(x)
    task = ember.runtime.Task(model, pool)            # runs on a pinned thread of its own
    future = task(x); ...; y = future.get()
    streams = ember.runtime.MultiStreamModule(model, num_streams=4)   # batch split over 4 pinned streams

Built on ember's core affinity API (``ember._C.pin_thread``), which also moves the OpenMP team the thread's
kernels run on; it works with GNU OpenMP, torch's runtime, and needs no Intel OpenMP.
"""

from ember.runtime import child_affinity
from ember.runtime.cpu_pool import CPUPool, process_cpus
from ember.runtime.multi_stream import MultiStreamModule
from ember.runtime.pin import pin
from ember.runtime.task import Task, TaskFuture

child_affinity.register_under_launcher()  # forked children (DataLoader workers) get the instance's CPUs

__all__ = ["CPUPool", "MultiStreamModule", "Task", "TaskFuture", "pin", "process_cpus"]
