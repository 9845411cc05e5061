"""Each instance's environment: OpenMP threads, affinity and waiting, and the memory allocator.

GNU OpenMP (the runtime torch's wheels and ember use): OMP_NUM_THREADS, OMP_PLACES (one place per CPU of the
instance) with OMP_PROC_BIND=close so each OpenMP thread stays on its CPU, OMP_SCHEDULE=STATIC and
OMP_DYNAMIC=FALSE. When the instance is bound (numactl, taskset or the launcher's own affinity), the places are
``threads``: libgomp makes one place of each CPU in the process's mask when it loads, which is the instance's CPUs.
An explicit list (``{4},{5},...``) would say the same to the first OpenMP runtime, but a second one that loads later
(scikit-learn and SciPy wheels carry their own libgomp) starts from the main thread's one-CPU mask and warns
"Number of places reduced"; from ``threads`` it makes the one place it can use, silently. Unbound, the list is
explicit. Intel OpenMP: KMP_AFFINITY and KMP_BLOCKTIME instead, with libiomp5 preloaded when torch does
not load it itself.

Allocators: glibc's malloc returns freed blocks to the OS eagerly and serializes large allocations, which shows as
page faults in every step of a training or inference loop; jemalloc and tcmalloc keep memory in per-thread caches.
jemalloc runs with freed pages kept (decay off) and every block in its arena for big ones (JEMALLOC_CONF).

GNU OpenMP binds the process's main thread to the first place when it loads. Threads and processes the main
thread starts later inherit that one-CPU mask. ember.runtime reads the instance's CPUs from EMBER_INSTANCE_CPUS
instead, and gives forked children (DataLoader workers) those CPUs back (ember.runtime.child_affinity);
``--no-omp-binding`` leaves OpenMP threads unbound (only the instance's CPU set holds them) for programs that start
their own threads or exec child processes.

A variable already set in the environment is kept, and the plan says so: what the user set wins.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ember.launch.plan import Instance, LaunchError

__all__ = ["Settings", "find_library", "instance_environment", "resolve_settings"]

ALLOCATOR_LIBRARIES = {
    "jemalloc": ("libjemalloc.so.2", "libjemalloc.so"),
    "tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4", "libtcmalloc_minimal.so", "libtcmalloc.so"),
}
ALLOCATOR_PACKAGES = {"jemalloc": "libjemalloc2", "tcmalloc": "libtcmalloc-minimal4"}
# Keep freed pages (no decay, so no page faults once warm) and put every allocation in the arena jemalloc keeps for
# big ones. IPEX's setting also had background_thread:true and metadata_thp:auto: with decay off the background
# thread has nothing to purge, and on the 2-core VM it cost ResNet-50 8% at batch 1 (docs/decisions.md).
JEMALLOC_CONF = "oversize_threshold:1,dirty_decay_ms:-1,muzzy_decay_ms:-1"
INTEL_OPENMP_LIBRARIES = ("libiomp5.so",)


@dataclass(frozen=True)
class Settings:
    """Launch-wide choices, resolved once from the options and what the machine has."""

    omp_runtime: str  # "gnu" or "intel"
    allocator: str  # "default", "jemalloc" or "tcmalloc"
    preload: tuple[str, ...] = ()  # libraries to LD_PRELOAD, in order
    omp_wait_policy: str | None = None  # "active" / "passive" / None (the runtime's default)
    omp_binding: bool = True  # bind OpenMP thread t to CPU t of the instance
    notes: tuple[str, ...] = field(default=(), compare=False)


@functools.lru_cache(maxsize=1)
def library_dirs() -> tuple[str, ...]:
    """Where shared libraries are looked for: LD_LIBRARY_PATH, the Python environment's lib (pip and conda put
    libiomp5 there), $CONDA_PREFIX/lib, the dynamic linker's cache, then the usual system directories."""
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    dirs.append(os.path.join(sys.prefix, "lib"))
    if os.environ.get("CONDA_PREFIX"):
        dirs.append(os.path.join(os.environ["CONDA_PREFIX"], "lib"))
    try:
        cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10, check=False).stdout
        for line in cache.splitlines():
            if "=>" in line:
                dirs.append(os.path.dirname(line.split("=>", 1)[1].strip()))
    except (OSError, subprocess.SubprocessError):
        pass
    dirs += ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/lib", "/usr/lib", "/lib/x86_64-linux-gnu"]
    return tuple(dict.fromkeys(dirs))


def find_library(names: tuple[str, ...], dirs: tuple[str, ...] | list[str] | None = None) -> str | None:
    """The first existing file called one of ``names`` in ``dirs`` (all names in one directory before the next)."""
    for directory in dirs if dirs is not None else library_dirs():
        for name in names:
            path = os.path.join(directory, name)
            if os.path.isfile(path):
                return path
    return None


def torch_openmp_runtime() -> str:
    """ "intel" when the torch this Python would import ships libiomp5 (conda's MKL builds), else "gnu".

    Read from torch's lib directory without importing torch.
    """
    spec = importlib.util.find_spec("torch")
    locations = (spec.submodule_search_locations or []) if spec is not None else []
    return "intel" if any(any(Path(loc, "lib").glob("libiomp5*.so*")) for loc in locations) else "gnu"


def resolve_settings(
    omp_runtime: str = "auto",
    allocator: str = "auto",
    omp_wait_policy: str | None = None,
    omp_binding: bool = True,
    dirs: tuple[str, ...] | list[str] | None = None,
    torch_runtime: str | None = None,
) -> Settings:
    """Turns ``--omp-runtime`` and ``--memory-allocator`` into libraries to preload.

    Raises:
        LaunchError: for an unknown choice, or a library asked for by name that is not installed.
    """
    if omp_runtime not in ("auto", "default", "intel"):
        raise LaunchError(f"--omp-runtime must be auto, default or intel, got {omp_runtime!r}")
    if allocator not in ("auto", "default", "jemalloc", "tcmalloc"):
        raise LaunchError(f"--memory-allocator must be auto, default, jemalloc or tcmalloc, got {allocator!r}")
    if omp_wait_policy not in (None, "active", "passive"):
        raise LaunchError(f"--omp-wait-policy must be active or passive, got {omp_wait_policy!r}")
    dirs = dirs if dirs is not None else library_dirs()
    torch_runtime = torch_runtime or torch_openmp_runtime()
    notes: list[str] = []
    preload: list[str] = []

    runtime = torch_runtime if omp_runtime in ("auto", "default") else "intel"
    if omp_runtime == "intel" and torch_runtime != "intel":
        iomp = find_library(INTEL_OPENMP_LIBRARIES, dirs)
        if iomp is None:
            raise LaunchError("--omp-runtime intel: libiomp5.so not found (pip install intel-openmp puts it in "
                              f"{os.path.join(sys.prefix, 'lib')})")  # fmt: skip
        preload.append(iomp)
        notes.append(f"Intel OpenMP preloaded ({iomp}); torch's GNU OpenMP calls are served by it")

    chosen = allocator
    if allocator == "auto":
        chosen = "default"
        for candidate in ("jemalloc", "tcmalloc"):
            if find_library(ALLOCATOR_LIBRARIES[candidate], dirs):
                chosen = candidate
                break
        if chosen == "default":
            notes.append("no jemalloc or tcmalloc found (apt-get install libjemalloc2 libtcmalloc-minimal4); "
                         "running on glibc's malloc")  # fmt: skip
    if chosen != "default":
        library = find_library(ALLOCATOR_LIBRARIES[chosen], dirs)
        if library is None:
            raise LaunchError(f"--memory-allocator {chosen}: {ALLOCATOR_LIBRARIES[chosen][0]} not found "
                              f"(apt-get install {ALLOCATOR_PACKAGES[chosen]})")  # fmt: skip
        preload.append(library)
    return Settings(runtime, chosen, tuple(preload), omp_wait_policy, omp_binding, tuple(notes))


def instance_environment(
    settings: Settings, instance: Instance, base: Mapping[str, str], bound: bool = True
) -> tuple[dict[str, str], list[str]]:
    """The variables to set for ``instance`` on top of ``base`` (the launcher's environment), and notes. ``bound``:
    the process starts with the instance's CPUs as its affinity mask (every binding but ``none``).

    Returns only what changes; a variable ``base`` already has is kept (and noted) unless it is LD_PRELOAD, which
    gets the launcher's libraries in front of the user's.
    """
    threads = len(instance.cpus)
    wanted: dict[str, str] = {"OMP_NUM_THREADS": str(threads), "EMBER_INSTANCE_CPUS": instance.cpu_list}
    if settings.omp_runtime == "gnu":
        if settings.omp_binding:
            wanted["OMP_PLACES"] = "threads" if bound else ",".join(f"{{{cpu}}}" for cpu in instance.cpus)
            wanted["OMP_PROC_BIND"] = "close"
        wanted["OMP_SCHEDULE"] = "STATIC"
        wanted["OMP_DYNAMIC"] = "FALSE"
        if settings.omp_wait_policy:
            wanted["OMP_WAIT_POLICY"] = settings.omp_wait_policy.upper()
    else:
        wanted["KMP_AFFINITY"] = "granularity=fine,compact,1,0" if settings.omp_binding else "disabled"
        wanted["KMP_BLOCKTIME"] = "0" if settings.omp_wait_policy == "passive" else "1"
    if settings.allocator == "jemalloc":
        wanted["MALLOC_CONF"] = JEMALLOC_CONF
    elif settings.allocator == "tcmalloc":
        # tcmalloc prints a line for every allocation over 1 GiB by default; large activations are routine here.
        wanted["TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD"] = str(1 << 40)

    changes: dict[str, str] = {}
    notes: list[str] = []
    for name, value in wanted.items():
        current = base.get(name)
        if current is None or current == value:
            changes[name] = value
        else:
            notes.append(f"kept {name}={current} from your environment (ember-run would set {value})")
    if settings.preload:
        user = [p for p in base.get("LD_PRELOAD", "").replace(":", " ").split() if p]
        ours = [p for p in settings.preload if p not in user]
        if ours:
            changes["LD_PRELOAD"] = ":".join(ours + user)
            if user:
                notes.append(f"LD_PRELOAD: {':'.join(ours)} added in front of your {':'.join(user)}")
    return changes, notes
