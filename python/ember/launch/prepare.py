"""What one ember-run launch will run, decided from its options: the instances, their environments and commands
(``prepare``), before any process starts. The command line (``cli``) and the autotuner (``autotune``) both plan
through it."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass, replace

from ember.launch import binding, distributed
from ember.launch.environment import Settings, instance_environment, resolve_settings
from ember.launch.plan import Instance, LaunchError, Layout, plan_instances
from ember.launch.runner import Process
from ember.launch.topology import Topology

__all__ = ["Launch", "prepare"]


@dataclass
class Launch:
    """Everything the options decided: the processes to start, how, and what to tell the user."""

    processes: list[Process]
    settings: Settings
    manager: str
    topology: Topology
    notes: list[str]
    prefix_output: bool
    distributed: bool
    base_environment: dict[str, str]  # what the processes inherit; describe() lists what each changes of it

    def describe(self) -> str:
        lines = [f"ember-run: {self.topology.describe()}",
                 f"  OpenMP: {self.settings.omp_runtime}; allocator: {self.settings.allocator}; "
                 f"binding: {self.manager}"]  # fmt: skip
        lines += [f"  note: {n}" for n in self.notes]
        for p in self.processes:
            i = p.instance
            span = " (spans NUMA nodes)" if i.spans_nodes else ""
            lines.append(f"instance {p.label}: {len(i.cpus)} CPUs [{i.cpu_list}], NUMA node(s) "
                         f"{','.join(map(str, i.nodes))}{span}")  # fmt: skip
            changed = {k: v for k, v in p.env.items() if self.base_environment.get(k) != v}
            lines += [f"  {k}={v}" for k, v in sorted(changed.items())]
            lines.append(f"  command: {' '.join(p.command)}")
            if p.log_path:
                lines.append(f"  log: {p.log_path}")
        return "\n".join(lines)


def _program_command(args: argparse.Namespace, unbuffered: bool) -> list[str]:
    if args.no_python and args.module:
        raise LaunchError("give -m/--module or --no-python, not both")
    if args.no_python:
        if shutil.which(args.program) is None:
            raise LaunchError(f"{args.program}: no such executable")
        return [args.program, *args.program_args]
    python = [sys.executable, *(["-u"] if unbuffered else [])]
    if args.module:
        return [*python, "-m", args.program, *args.program_args]
    if not os.path.isfile(args.program):
        raise LaunchError(f"{args.program}: no such file (use -m for a module, --no-python for an executable)")
    return [*python, args.program, *args.program_args]


def _is_distributed(args: argparse.Namespace) -> bool:
    return any(v is not None for v in (args.nnodes, args.nproc_per_node, args.node_rank, args.hostfile,
                                       args.master_addr, args.master_port))  # fmt: skip


def _plan_job(args: argparse.Namespace, topology: Topology) -> distributed.Job:
    if args.instance_idx is not None:
        raise LaunchError("--instance-idx does not apply to a distributed run")
    nproc = args.nproc_per_node
    if nproc is None:  # one process per NUMA node this process may use
        nproc = args.ninstances or len({c.node for c in topology.cpus if c.id in topology.allowed})
    elif args.ninstances is not None and args.ninstances != nproc:
        raise LaunchError(f"--ninstances {args.ninstances} disagrees with --nproc-per-node {nproc}")
    return distributed.plan_job(nproc, args.nnodes, args.node_rank, args.master_addr, args.master_port,
                                args.hostfile)  # fmt: skip


def _log_path(args: argparse.Namespace, instance: Instance, rank: str | None) -> str | None:
    """LOG_DIR/PREFIX_instance_I_cores_LIST.log (rank_R for a distributed run), or None without --log-dir."""
    if not args.log_dir:
        return None
    who = f"instance_{instance.index}" if rank is None else f"rank_{rank}"
    return os.path.join(args.log_dir, f"{args.log_file_prefix}_{who}_cores_{instance.cpu_list.replace(',', '_')}.log")


def prepare(
    args: argparse.Namespace,
    topology: Topology | None = None,
    environ: dict[str, str] | None = None,
    settings: Settings | None = None,
    manager: str | None = None,
) -> Launch:
    """Plans the launch the options ask for (no process started). ``topology``, ``environ``, ``settings`` and
    ``manager`` default to this machine's; tests pass recorded ones.

    Raises:
        LaunchError: for anything the options ask that cannot be done (the message says what).
    """
    topology = topology or Topology.from_system()
    base = dict(os.environ if environ is None else environ)
    layout = Layout(args.ninstances, args.ncores_per_instance, args.latency_mode, args.throughput_mode,
                    args.cores_list, args.nodes_list, args.use_logical_cores, args.strategy)  # fmt: skip
    job = _plan_job(args, topology) if _is_distributed(args) else None
    if job is not None:
        layout = replace(layout, ninstances=job.nproc_per_node, throughput_mode=False)
    instances: list[Instance] = plan_instances(topology, layout)
    if args.instance_idx is not None:
        if not 0 <= args.instance_idx < len(instances):
            raise LaunchError(f"--instance-idx {args.instance_idx} is outside the plan's {len(instances)} instances")
        instances = [instances[args.instance_idx]]

    settings = settings or resolve_settings(
        args.omp_runtime, args.memory_allocator, args.omp_wait_policy, not args.no_omp_binding
    )
    notes = list(settings.notes)
    if manager is None:
        manager, manager_notes = binding.choose_manager(args.multi_task_manager, instances[0].cpus[0],
                                                        args.bind_numa_node)  # fmt: skip
        notes += manager_notes
    if args.bind_numa_node and manager != "numactl":
        notes.append(f"--bind-numa-node needs numactl; memory is not bound ({manager} binds CPUs only)")
    prefix_output = len(instances) > 1
    capture = prefix_output or args.log_dir is not None or args.autotune
    command = _program_command(args, unbuffered=capture)
    if args.log_dir:
        _make_log_dir(args.log_dir)

    processes = []
    for i in instances:
        changes, env_notes = instance_environment(settings, i, base, bound=manager != "none")
        notes += [f"instance {i.index}: {n}" for n in env_notes]
        label = str(i.index)
        if job is not None:
            changes.update(job.environment(i.index))
            label = f"rank{changes['RANK']}"
        log_path = _log_path(args, i, None if job is None else changes["RANK"])
        prefix = binding.binding_prefix(manager, i, args.bind_numa_node)
        processes.append(Process(i, [*prefix, *command], {**base, **changes}, label, log_path,
                                 pin_with_affinity=manager == "affinity"))  # fmt: skip
    return Launch(processes, settings, manager, topology, notes, prefix_output, job is not None, base)


def _make_log_dir(path: str) -> None:
    """Creates --log-dir (and its parents), or says in one line why it cannot be used."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        raise LaunchError(f"--log-dir {path!r} cannot be created: {error.strerror}") from error
    if not os.access(path, os.W_OK | os.X_OK):
        raise LaunchError(f"--log-dir {path!r} is not writable")
