"""Forked children of an ember-run instance run on the instance's CPUs, not on the main thread's one CPU.

With OpenMP binding on (ember-run's default), GNU OpenMP binds the thread that loads it (the main thread, at
``import torch``) to the first place: one CPU. A forked child inherits the affinity of the thread that forked it,
so every DataLoader worker and multiprocessing child of the instance would share that one CPU with each other and
with the main thread's share of the model's work. Under ember-run, ``import ember`` registers a fork hook that
gives such a child the instance's CPUs back (EMBER_INSTANCE_CPUS); the parent's binding is left as it is.

Only children made by ``os.fork`` pass through the hook: DataLoader workers and multiprocessing's ``fork`` start
method (Linux's default before Python 3.14). A child that execs a new program (``subprocess``, the ``spawn`` and
``forkserver`` start methods) inherits the one CPU, and its own libgomp warns "Number of places reduced";
``ember-run --no-omp-binding`` leaves the main thread unbound and avoids both.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping

from ember.launch.topology import parse_cpu_list

_registered = False


def cpus_for_child(inherited: set[int], environ: Mapping[str, str]) -> set[int] | None:
    """The CPUs a freshly forked child should run on, or None to keep what it inherited.

    Only OpenMP's binding of the main thread is undone: one inherited CPU inside a larger instance. A thread the
    program pinned to a pool of two or more CPUs (ember.runtime.pin) forks its children onto that pool; one pinned
    to a single CPU looks like the main thread and its children are widened too. Outside ember-run nothing changes.
    """
    listed = environ.get("EMBER_INSTANCE_CPUS")
    if not listed:
        return None
    instance = set(parse_cpu_list(listed))
    if len(inherited) != 1 or not inherited < instance:
        return None
    return instance


def _widen_after_fork() -> None:
    cpus = cpus_for_child(os.sched_getaffinity(0), os.environ)
    if cpus is None:
        return
    # If the instance's CPUs are no longer all ours (a cpuset changed under us), the child keeps the CPU it
    # inherited, as it would have without ember; raising here would only print a warning in the child.
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, cpus)


def register() -> None:
    """Registers the fork hook once, and only in a process ember-run started."""
    global _registered
    if _registered or "EMBER_INSTANCE_CPUS" not in os.environ:
        return
    os.register_at_fork(after_in_child=_widen_after_fork)
    _registered = True
