"""How an instance is held to its CPUs (and memory nodes): numactl, taskset, or the launcher's own
sched_setaffinity before it starts the process (the child inherits the mask), for containers where numactl's
memory policy calls are refused or neither tool is installed."""

from __future__ import annotations

import shutil
import subprocess

from ember.launch.plan import Instance, LaunchError

__all__ = ["MANAGERS", "binding_prefix", "choose_manager"]

MANAGERS = ("auto", "numactl", "taskset", "none")


def _works(command: list[str]) -> bool:
    try:
        return subprocess.run(command, capture_output=True, timeout=10, check=False).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def choose_manager(requested: str, probe_cpu: int, bind_memory: bool) -> tuple[str, list[str]]:
    """The binding method to use and notes about the choice.

    ``auto`` takes numactl if it is installed and a trial run on ``probe_cpu`` succeeds, else taskset, else the
    launcher's own sched_setaffinity ("affinity"). ``none`` binds nothing (the OpenMP settings still apply).

    Raises:
        LaunchError: for an unknown method, or one asked for by name that is missing or refused here.
    """
    if requested not in MANAGERS:
        raise LaunchError(f"--multi-task-manager must be one of {', '.join(MANAGERS)}, got {requested!r}")
    if requested == "none":
        return "none", []
    numactl_trial = ["numactl", f"--physcpubind={probe_cpu}"] + (["--localalloc"] if bind_memory else []) + ["true"]
    if requested == "numactl":
        if shutil.which("numactl") is None:
            raise LaunchError("--multi-task-manager numactl: numactl is not installed (apt-get install numactl)")
        if not _works(numactl_trial):
            raise LaunchError("--multi-task-manager numactl: numactl is refused here (a container without "
                              "CAP_SYS_NICE?); use taskset or auto")  # fmt: skip
        return "numactl", []
    if requested == "taskset":
        if shutil.which("taskset") is None:
            raise LaunchError("--multi-task-manager taskset: taskset is not installed (apt-get install util-linux)")
        return "taskset", []
    notes = []
    if shutil.which("numactl") is not None:
        if _works(numactl_trial):
            return "numactl", []
        notes.append("numactl is refused here; binding CPUs without it")
    if shutil.which("taskset") is not None and _works(["taskset", "-c", str(probe_cpu), "true"]):
        return "taskset", notes
    return "affinity", [*notes, "binding with sched_setaffinity (no usable numactl or taskset)"]


def binding_prefix(manager: str, instance: Instance, bind_memory: bool) -> list[str]:
    """The command words that bind ``instance`` ("affinity" and "none" need none: see runner.py)."""
    if manager == "numactl":
        memory = [f"--membind={','.join(map(str, instance.nodes))}"] if bind_memory else []
        return ["numactl", f"--physcpubind={instance.cpu_list}", *memory]
    if manager == "taskset":
        return ["taskset", "-c", instance.cpu_list]
    return []
