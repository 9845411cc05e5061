"""The machine as the launcher sees it: logical CPUs, their physical cores, sockets and NUMA nodes, and which of
them this process may use.

Read from sysfs (``/sys/devices/system/cpu``, ``/sys/devices/system/node``), or from ``lscpu -p`` output, which is
also the format of the recorded topologies the tests plan against. The usable set is the intersection of the
process's affinity mask and its cgroup's cpuset: a container restricted to CPUs 4-11 sees only those, although
sysfs lists every CPU of the host.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ember import _C

__all__ = ["Cpu", "Topology", "format_cpu_list", "parse_cpu_list"]


def parse_cpu_list(text: str) -> list[int]:
    """Parses the kernel's CPU list format ("0-3,8,10-11") into sorted CPU ids.

    Raises:
        ValueError: for anything that is not a comma-separated list of ids and ascending ranges.
    """
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if match is None:
            raise ValueError(f"not a CPU list: {text!r} (expected ids and ranges such as '0-3,8')")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise ValueError(f"not a CPU list: {text!r} (range {part} runs backwards)")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def format_cpu_list(cpus: list[int] | tuple[int, ...] | frozenset[int]) -> str:
    """The inverse of :func:`parse_cpu_list`: sorted ids with runs folded into ranges ("0-3,8")."""
    ids = sorted(cpus)
    parts: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)


@dataclass(frozen=True)
class Cpu:
    """One logical CPU. ``core`` numbers physical cores uniquely across sockets (SMT siblings share it)."""

    id: int
    core: int
    socket: int
    node: int


@dataclass(frozen=True)
class Topology:
    """Every online logical CPU, and the ids of those this process may run on (``allowed``)."""

    cpus: tuple[Cpu, ...]
    allowed: frozenset[int]
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.cpus:
            raise ValueError("a topology needs at least one CPU")
        if not self.allowed:
            raise ValueError(f"no CPU of this topology ({self.source or 'given'}) is usable by this process")

    # --- construction -------------------------------------------------------------------------------------------

    @classmethod
    def from_lscpu(cls, text: str, allowed: list[int] | None = None, source: str = "lscpu") -> Topology:
        """Builds a topology from ``lscpu -p=CPU,CORE,SOCKET,NODE`` output.

        Lines starting with '#' are comments, except ``# allowed: <cpu list>``, which recorded topologies use for
        the usable set. ``allowed`` (when given) overrides it; neither means every CPU listed.
        """
        cpus: list[Cpu] = []
        recorded_allowed: list[int] | None = None
        for line in text.splitlines():
            line = line.strip()
            if not line:
                continue
            if line.startswith("#"):
                match = re.match(r"#\s*allowed:\s*(.+)", line)
                if match:
                    recorded_allowed = parse_cpu_list(match.group(1))
                continue
            fields = line.split(",")
            if len(fields) < 4:
                raise ValueError(f"{source}: expected 'CPU,CORE,SOCKET,NODE' lines, got {line!r}")
            cpu, core, socket, node = (int(f) if f else 0 for f in fields[:4])
            cpus.append(Cpu(cpu, core, socket, node))
        usable = allowed if allowed is not None else recorded_allowed
        ids = {c.id for c in cpus}
        return cls(tuple(sorted(cpus, key=lambda c: c.id)), frozenset(ids if usable is None else ids & set(usable)),
                   source)  # fmt: skip

    @classmethod
    def from_system(cls, sysfs: str = "/sys") -> Topology:
        """The running machine, from sysfs; the usable set from the affinity mask and the cgroup cpuset."""
        cpu_root = Path(sysfs, "devices/system/cpu")
        online = parse_cpu_list((cpu_root / "online").read_text())
        node_of = _nodes_by_cpu(Path(sysfs, "devices/system/node"))
        cores: dict[tuple[int, int], int] = {}  # (socket, core_id) -> unique core number
        cpus = []
        for cpu in online:
            topo = cpu_root / f"cpu{cpu}/topology"
            socket = _read_int(topo / "physical_package_id", 0)
            core_key = (socket, _read_int(topo / "core_id", cpu))
            core = cores.setdefault(core_key, len(cores))
            cpus.append(Cpu(cpu, core, socket, node_of.get(cpu, 0)))
        # Under ember-run the instance's CPUs, else the CPUs the process was given (_C.process_cpus: not the
        # calling thread's mask, which may be pinned to a pool; where OpenMP binds threads, not the main thread's
        # either, which it bound to one CPU).
        instance = os.environ.get("EMBER_INSTANCE_CPUS")
        mask = parse_cpu_list(instance) if instance else _C.process_cpus()
        allowed = set(mask) & set(online)
        cpuset = cgroup_cpuset()
        if cpuset is not None:
            allowed &= set(cpuset)
        return cls(tuple(cpus), frozenset(allowed), "sysfs")

    # --- queries ------------------------------------------------------------------------------------------------

    def cpu(self, cpu_id: int) -> Cpu:
        for c in self.cpus:
            if c.id == cpu_id:
                return c
        raise KeyError(cpu_id)

    @property
    def nodes(self) -> list[int]:
        return sorted({c.node for c in self.cpus})

    @property
    def sockets(self) -> list[int]:
        return sorted({c.socket for c in self.cpus})

    @property
    def threads_per_core(self) -> int:
        per_core: dict[int, int] = {}
        for c in self.cpus:
            per_core[c.core] = per_core.get(c.core, 0) + 1
        return max(per_core.values())

    def usable_cpus(self, logical: bool = False, nodes: Sequence[int] | None = None) -> list[int]:
        """Usable CPU ids, ordered by NUMA node, then physical core, then SMT sibling.

        Without ``logical``, one CPU per physical core: the first usable sibling. (OpenMP threads on two siblings
        of one core share its vector units; compute-bound kernels run no faster on both than on one.) With it, the
        siblings of a core stay adjacent, so an instance that takes consecutive CPUs owns whole cores and no two
        instances share one.
        """
        chosen: list[Cpu] = []
        seen_cores: set[int] = set()
        for c in sorted(self.cpus, key=lambda c: (c.node, c.core, c.id)):
            if c.id not in self.allowed or (nodes is not None and c.node not in nodes):
                continue
            if not logical:
                if c.core in seen_cores:
                    continue
                seen_cores.add(c.core)
            chosen.append(c)
        return [c.id for c in chosen]

    def describe(self) -> str:
        sockets, nodes = len(self.sockets), len(self.nodes)
        cores = len({c.core for c in self.cpus})
        return (f"{len(self.cpus)} logical CPUs, {cores} physical cores ({self.threads_per_core} threads each), "
                f"{sockets} socket{'s' * (sockets > 1)}, {nodes} NUMA node{'s' * (nodes > 1)}; "
                f"usable: {format_cpu_list(self.allowed)}")  # fmt: skip


def cgroup_cpuset(cgroup_root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup") -> list[int] | None:
    """The CPUs this process's cgroup allows (cgroup v2 ``cpuset.cpus.effective`` or v1 ``cpuset.effective_cpus``),
    or None when there is no cpuset controller to read."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    candidates = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        path = path.lstrip("/")
        if controllers == "":  # v2 unified hierarchy
            candidates.append(Path(cgroup_root, path, "cpuset.cpus.effective"))
        elif "cpuset" in controllers.split(","):
            candidates.append(Path(cgroup_root, "cpuset", path, "cpuset.effective_cpus"))
    for candidate in candidates:
        try:
            text = candidate.read_text().strip()
        except OSError:
            continue
        if text:
            return parse_cpu_list(text)
    return None


def _nodes_by_cpu(node_root: Path) -> dict[int, int]:
    nodes: dict[int, int] = {}
    if not node_root.is_dir():
        return nodes
    for entry in node_root.iterdir():
        match = re.fullmatch(r"node(\d+)", entry.name)
        if match:
            for cpu in parse_cpu_list((entry / "cpulist").read_text()):
                nodes[cpu] = int(match.group(1))
    return nodes


def _read_int(path: Path, default: int) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return default
