"""Forked children run on the CPUs their parent thread was given, not on the one CPU that thread is bound to.

Two bindings leave a thread on one CPU of a larger set, and a forked child inherits the affinity of the thread
that forked it:

- GNU OpenMP, with binding on (ember-run's default), binds the thread that loads it (the main thread, at
  ``import torch``) to the first place. Every DataLoader worker and multiprocessing child of an ember-run instance
  would share that CPU with each other and with the main thread's share of the model's work.
- ``ember.runtime.pin(pool)`` puts the calling thread on the pool's first CPU (its OpenMP team on the others).

A fork hook gives such a child the whole set back: the pool of the innermost ``pin`` the forking thread is in,
else, under ember-run, the instance's CPUs (EMBER_INSTANCE_CPUS). The parent keeps its binding. The hook is
registered by ``import ember`` under ember-run and by the first ``pin``; otherwise nothing changes.

Only children made by ``os.fork`` pass through the hook: DataLoader workers and multiprocessing's ``fork`` start
method (Linux's default before Python 3.14). A child that execs a new program (``subprocess``, the ``spawn`` and
``forkserver`` start methods) inherits the one CPU, and its own libgomp warns "Number of places reduced";
``ember-run --no-omp-binding`` leaves the main thread unbound and avoids both.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence

from ember.launch.topology import parse_cpu_list
from ember.runtime.pinned import pinned_cpus

_registered = False


def cpus_for_child(
    inherited: set[int], environ: Mapping[str, str], pinned: Sequence[int] | None = None
) -> set[int] | None:
    """The CPUs a freshly forked child should run on, or None to keep what it inherited.

    `pinned`: the CPUs of the innermost pin the forking thread was in. Outside a pin, only OpenMP's binding of the
    main thread is undone: one inherited CPU inside a larger ember-run instance. (A thread the program bound to one
    CPU of the instance by other means looks the same, and its children are widened too.)
    """
    if pinned:
        return None if inherited == set(pinned) else set(pinned)
    listed = environ.get("EMBER_INSTANCE_CPUS")
    if not listed:
        return None
    instance = set(parse_cpu_list(listed))
    if len(inherited) != 1 or not inherited < instance:
        return None
    return instance


def _widen_after_fork() -> None:
    cpus = cpus_for_child(os.sched_getaffinity(0), os.environ, pinned_cpus())
    if cpus is None:
        return
    # If those CPUs are no longer all ours (a cpuset changed under us), the child keeps the CPU it inherited, as it
    # would have without ember; raising here would only print a warning in the child.
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, cpus)


def register() -> None:
    """Registers the fork hook, once."""
    global _registered
    if not _registered:
        os.register_at_fork(after_in_child=_widen_after_fork)
        _registered = True


def register_under_launcher() -> None:
    """Registers the fork hook if ember-run started this process."""
    if "EMBER_INSTANCE_CPUS" in os.environ:
        register()
