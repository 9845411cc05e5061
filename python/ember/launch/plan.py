"""Which CPUs and memory nodes each instance gets.

An instance is one process of the program. The pool of CPUs to share out is the usable set (topology.py), one CPU
per physical core unless logical cores were asked for, narrowed by ``--nodes-list`` or replaced by
``--cores-list``. Instances take equal, disjoint slices of it:

- ``close`` gives instance i the i-th slice in topology order, so the first instances fill the first NUMA node;
- ``scatter`` deals the slices out round-robin over the NUMA nodes, so four instances on a two-node machine put two
  on each node and use both nodes' memory bandwidth.

Either way a slice stays within one NUMA node whenever the nodes hold enough whole slices; only an instance larger
than a node, or a layout that needs the left-over CPUs of several nodes, spans nodes (and the plan says so).
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.launch.topology import Topology, format_cpu_list

__all__ = ["Instance", "LaunchError", "Layout", "plan_instances", "pool_cpus"]

LATENCY_MODE_CORES = 4


class LaunchError(ValueError):
    """A launch that cannot be planned as asked (the message says which option and why)."""


@dataclass(frozen=True)
class Layout:
    """What the user asked for; None means "not given"."""

    ninstances: int | None = None
    ncores_per_instance: int | None = None
    latency_mode: bool = False
    throughput_mode: bool = False
    cores_list: tuple[int, ...] | None = None
    nodes_list: tuple[int, ...] | None = None
    use_logical_cores: bool = False
    strategy: str = "close"


@dataclass(frozen=True)
class Instance:
    """One process to start: its index, CPUs (OpenMP thread t runs on cpus[t]) and their NUMA nodes."""

    index: int
    cpus: tuple[int, ...]
    nodes: tuple[int, ...]

    @property
    def cpu_list(self) -> str:
        return format_cpu_list(self.cpus)

    @property
    def spans_nodes(self) -> bool:
        return len(self.nodes) > 1


def plan_instances(topology: Topology, layout: Layout) -> list[Instance]:
    """Shares the pool out among the instances.

    Raises:
        LaunchError: for contradictory options, a core or node list outside what this process may use, or more
            instances (or cores an instance) than the pool holds.
    """
    if layout.strategy not in ("close", "scatter"):
        raise LaunchError(f"--strategy must be 'close' or 'scatter', got {layout.strategy!r}")
    pool = pool_cpus(topology, layout)
    node_of = {c.id: c.node for c in topology.cpus}
    by_node: dict[int, list[int]] = {}
    for cpu in pool:
        by_node.setdefault(node_of[cpu], []).append(cpu)

    if layout.throughput_mode:
        if layout.ninstances is not None or layout.ncores_per_instance is not None or layout.latency_mode:
            raise LaunchError("--throughput-mode sets the instances itself (one per NUMA node); it takes no "
                              "--ninstances, --ncores-per-instance or --latency-mode")  # fmt: skip
        slices = list(by_node.values())
    else:
        count, size = _counts(len(pool), [len(cpus) for cpus in by_node.values()], layout)
        slices = _slices(pool, by_node, count, size, layout.strategy)
    return [Instance(i, tuple(s), tuple(sorted({node_of[c] for c in s}))) for i, s in enumerate(slices)]


def pool_cpus(topology: Topology, layout: Layout) -> list[int]:
    """The CPUs to share out: ``--cores-list``, or the usable CPUs (physical cores unless logical ones were asked
    for) of ``--nodes-list`` or of every node. Raises LaunchError for lists outside the usable CPUs."""
    if layout.cores_list is not None:
        if layout.nodes_list is not None:
            raise LaunchError("give --cores-list or --nodes-list, not both")
        if len(set(layout.cores_list)) != len(layout.cores_list):
            raise LaunchError(f"--cores-list names a CPU twice: {list(layout.cores_list)}")
        known = {c.id for c in topology.cpus}
        outside = [c for c in layout.cores_list if c not in topology.allowed]
        if outside:
            unknown = [c for c in outside if c not in known]
            why = f"CPUs {unknown} do not exist" if unknown else "this process may not run on them"
            raise LaunchError(f"--cores-list {format_cpu_list(layout.cores_list)} is outside the usable CPUs "
                              f"{format_cpu_list(topology.allowed)}: {format_cpu_list(outside)} ({why})")  # fmt: skip
        return list(layout.cores_list)
    if layout.nodes_list is not None:
        missing = sorted(set(layout.nodes_list) - set(topology.nodes))
        if missing:
            raise LaunchError(f"--nodes-list names NUMA nodes {missing}; this machine has {topology.nodes}")
    pool = topology.usable_cpus(logical=layout.use_logical_cores, nodes=layout.nodes_list)
    if not pool:
        raise LaunchError(f"no usable CPU on NUMA nodes {list(layout.nodes_list or [])} "
                          f"(usable: {format_cpu_list(topology.allowed)})")  # fmt: skip
    return pool


def _counts(pool_size: int, node_sizes: list[int], layout: Layout) -> tuple[int, int]:
    """(instances, CPUs each) from the options, checked against the pool. Given only the size, as many instances
    as the nodes hold whole (none straddling two nodes), or as the pool holds if no node holds one."""
    count, size = layout.ninstances, layout.ncores_per_instance
    for name, value in (("--ninstances", count), ("--ncores-per-instance", size)):
        if value is not None and value < 1:
            raise LaunchError(f"{name} must be at least 1, got {value}")
    if layout.latency_mode:
        if size is not None:
            raise LaunchError(f"--latency-mode runs {LATENCY_MODE_CORES} cores an instance; it takes no "
                              "--ncores-per-instance")  # fmt: skip
        size = min(LATENCY_MODE_CORES, pool_size)
    what = "CPUs" if layout.use_logical_cores or layout.cores_list is not None else "physical cores"
    if count is not None and count > pool_size:
        raise LaunchError(f"--ninstances {count} is more instances than the {pool_size} usable {what}")
    if size is not None and size > pool_size:
        raise LaunchError(f"--ncores-per-instance {size} is more than the {pool_size} usable {what}")
    if count is None and size is None:
        return 1, pool_size
    if count is None:
        assert size is not None
        return (sum(n // size for n in node_sizes) or pool_size // size), size
    if size is None:
        return count, pool_size // count
    if count * size > pool_size:
        raise LaunchError(f"{count} instances of {size} cores need {count * size} {what}; {pool_size} are usable")
    return count, size


def _slices(pool: list[int], by_node: dict[int, list[int]], count: int, size: int, strategy: str) -> list[list[int]]:
    # Node-local slices when the nodes hold enough of them, in node order ("close") or dealt round-robin over the
    # nodes ("scatter"); otherwise consecutive slices of the whole pool.
    per_node = [[cpus[i * size : (i + 1) * size] for i in range(len(cpus) // size)] for cpus in by_node.values()]
    if sum(len(s) for s in per_node) >= count:
        if strategy == "close":
            ordered = [s for node in per_node for s in node]
        else:
            ordered = [node[i] for i in range(max(len(n) for n in per_node)) for node in per_node if i < len(node)]
        return ordered[:count]
    if strategy == "scatter" and len(by_node) > 1:
        # Slices must span nodes: take each slice's CPUs round-robin over the nodes so every slice spans them evenly.
        interleaved = [node[i] for i in range(max(len(n) for n in by_node.values())) for node in by_node.values()
                       if i < len(node)]  # fmt: skip
        return [interleaved[i * size : (i + 1) * size] for i in range(count)]
    return [pool[i * size : (i + 1) * size] for i in range(count)]
