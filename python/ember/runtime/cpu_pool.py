"""CPUPool: a set of CPUs that threads of this process can be pinned to (``ember.runtime.pin``)."""

from __future__ import annotations

import functools

from ember.launch.topology import Topology, format_cpu_list

__all__ = ["CPUPool", "process_cpus"]


@functools.lru_cache(maxsize=1)
def _topology() -> Topology:
    return Topology.from_system()


def process_cpus() -> frozenset[int]:
    """The CPUs this process may run on: the instance's CPUs under ember-run (EMBER_INSTANCE_CPUS), else those the
    process was given (``_C.process_cpus``: the CPUs of OpenMP's places where it binds threads, the main thread's
    mask where it does not); within the cgroup's cpuset either way (``Topology.from_system`` decides).

    Not the calling thread's mask, which may be pinned to a pool; nor, where OpenMP binds threads (ember-run's
    OMP_PROC_BIND, or one set by hand), the main thread's: GNU OpenMP binds it to the first place as it loads.
    """
    return _topology().allowed


class CPUPool:
    """An ordered set of CPUs. Pin a thread to it with ``ember.runtime.pin(pool)``; OpenMP thread t of the pinned
    thread's kernels runs on ``core_ids[t]``.

    Args:
        core_ids: the CPU ids (logical CPU numbers, as in ``lscpu`` and ``taskset``), in the order threads take them.
        node_id: a NUMA node: the pool is that node's usable physical cores (one CPU per core).
        With neither, the pool is every usable physical core of the process.

    Raises:
        ValueError: for both arguments at once, an empty or repeated list, CPUs this process may not use, or a node
            with no usable CPU.
    """

    def __init__(self, core_ids: list[int] | tuple[int, ...] | None = None, node_id: int | None = None) -> None:
        topology = _topology()
        usable = process_cpus()
        if core_ids is not None and node_id is not None:
            raise ValueError("CPUPool: give core_ids or node_id, not both")
        if core_ids is not None:
            ids = [int(c) for c in core_ids]
            if not ids:
                raise ValueError("CPUPool: core_ids is empty")
            if len(set(ids)) != len(ids):
                raise ValueError(f"CPUPool: core_ids names a CPU twice: {ids}")
            outside = sorted(set(ids) - usable)
            if outside:
                raise ValueError(f"CPUPool: CPUs {format_cpu_list(outside)} are outside the ones this process may use "
                                 f"({format_cpu_list(usable)})")  # fmt: skip
        elif node_id is not None:
            if node_id not in topology.nodes:
                raise ValueError(f"CPUPool: node_id {node_id} is not a NUMA node of this machine ({topology.nodes})")
            ids = topology.usable_cpus(nodes=[node_id])
            if not ids:
                raise ValueError(f"CPUPool: NUMA node {node_id} has no CPU this process may use")
        else:
            ids = topology.usable_cpus()
        self._core_ids = tuple(ids)
        self._node_id = node_id

    @property
    def core_ids(self) -> tuple[int, ...]:
        return self._core_ids

    @property
    def node_id(self) -> int | None:
        return self._node_id

    def __len__(self) -> int:
        return len(self._core_ids)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CPUPool) and other._core_ids == self._core_ids

    def __hash__(self) -> int:
        return hash(self._core_ids)

    def __repr__(self) -> str:
        node = f", node_id={self._node_id}" if self._node_id is not None else ""
        return f"CPUPool(core_ids=[{format_cpu_list(self._core_ids)}]{node})"

    def split(self, parts: int) -> list[CPUPool]:
        """``parts`` disjoint pools of consecutive CPUs, sizes differing by at most one (larger ones first).

        Raises:
            ValueError: unless 1 <= parts <= len(self).
        """
        if not 1 <= parts <= len(self):
            raise ValueError(f"CPUPool.split: parts must be in [1, {len(self)}] for a pool of {len(self)} CPUs, "
                             f"got {parts}")  # fmt: skip
        base, extra = divmod(len(self), parts)
        pools, start = [], 0
        for i in range(parts):
            size = base + (i < extra)
            pools.append(CPUPool(self._core_ids[start : start + size]))
            start += size
        return pools
