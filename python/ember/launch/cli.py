"""ember-run: the command line. ``ember-run [options] program.py [args]``; ``ember-run --help`` for the options."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass, replace

from ember.launch import binding, distributed
from ember.launch.environment import Settings, instance_environment, resolve_settings
from ember.launch.plan import Instance, LaunchError, Layout, plan_instances
from ember.launch.runner import Process, run_processes
from ember.launch.topology import Topology, parse_cpu_list

__all__ = ["Launch", "build_parser", "main", "prepare"]


def _cpu_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(parse_cpu_list(text))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ember-run",
        description="Run a Python program (or any executable) as tuned instances: each on its own cores and NUMA "
        "memory, with OpenMP and allocator settings to match; or as the processes of a torch.distributed job.",
        epilog="Programs report throughput to --autotune with lines 'EMBER_THROUGHPUT <number> [unit]' on stdout "
        "(ember.launch.report_throughput prints them). docs/launcher.md has the details.",
    )
    layout = parser.add_argument_group("instances and cores")
    layout.add_argument("--ninstances", type=int, help="number of instances (default: 1, or as many as fit)")
    layout.add_argument("--ncores-per-instance", type=int, help="cores each instance runs on")
    layout.add_argument("--instance-idx", type=int, help="start only this instance of the plan")
    layout.add_argument("--latency-mode", action="store_true", help="4 cores an instance, as many as fit")
    layout.add_argument("--throughput-mode", action="store_true", help="one instance per NUMA node, all its cores")
    layout.add_argument("--cores-list", type=_cpu_list, help="CPUs to share out, e.g. '0-7,16-23'")
    layout.add_argument("--nodes-list", type=_cpu_list, help="NUMA nodes whose cores to share out, e.g. '0' or '0,1'")
    layout.add_argument("--use-logical-cores", action="store_true", help="count SMT siblings as cores")
    layout.add_argument(
        "--strategy",
        choices=("close", "scatter"),
        default="close",
        help="close: fill NUMA nodes in order; scatter: deal instances out over the nodes",
    )
    layout.add_argument(
        "--bind-numa-node",
        action="store_true",
        help="allocate each instance's memory only on its cores' NUMA nodes (numactl --membind)",
    )
    tuning = parser.add_argument_group("runtime tuning")
    tuning.add_argument(
        "--memory-allocator",
        choices=("auto", "default", "jemalloc", "tcmalloc"),
        default="auto",
        help="auto: jemalloc, else tcmalloc, else glibc's (default)",
    )
    tuning.add_argument(
        "--omp-runtime",
        choices=("auto", "default", "intel"),
        default="auto",
        help="auto/default: the OpenMP torch loads (GNU for pip wheels); intel: preload libiomp5",
    )
    tuning.add_argument(
        "--omp-wait-policy",
        choices=("active", "passive"),
        help="how idle OpenMP threads wait (default: the runtime's own)",
    )
    tuning.add_argument(
        "--no-omp-binding",
        action="store_true",
        help="leave OpenMP threads unbound within the instance's CPUs (for programs that start their own threads "
        "or exec child processes, which inherit the main thread's one-CPU binding otherwise)",
    )
    tuning.add_argument(
        "--multi-task-manager",
        choices=binding.MANAGERS,
        default="auto",
        help="how instances are bound: numactl, taskset, or auto (falls back to sched_setaffinity)",
    )
    tuning.add_argument(
        "--autotune",
        action="store_true",
        help="try layouts, allocators and OpenMP settings for --autotune-seconds each, print a "
        "table, then run the best",
    )
    tuning.add_argument("--autotune-seconds", type=float, default=30.0, help="how long each candidate runs")
    dist = parser.add_argument_group("torch.distributed")
    dist.add_argument("--nnodes", type=int, help="nodes in the job")
    dist.add_argument("--nproc-per-node", type=int, help="processes on this node (default: one per NUMA node)")
    dist.add_argument("--node-rank", type=int, help="this node's rank")
    dist.add_argument("--master-addr", help="address of rank 0's node")
    dist.add_argument("--master-port", type=int, help=f"rank 0's port (default {distributed.DEFAULT_MASTER_PORT})")
    dist.add_argument("--hostfile", help="the job's nodes, one a line; sets --nnodes and --master-addr")
    run = parser.add_argument_group("what to run")
    run.add_argument("-m", "--module", action="store_true", help="run the program as a module (python -m)")
    run.add_argument("--no-python", action="store_true", help="the program is an executable, not a Python script")
    run.add_argument("--log-dir", help="write each instance's output to a file there too")
    run.add_argument("--log-file-prefix", default="run", help="log file names start with this (default: run)")
    run.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    parser.add_argument("program", help="the script (or module, or executable) to run")
    parser.add_argument("program_args", nargs=argparse.REMAINDER, help="its arguments")
    return parser


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
            changed = {k: v for k, v in p.env.items() if os.environ.get(k) != v}
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
        changes, env_notes = instance_environment(settings, i, base)
        notes += [f"instance {i.index}: {n}" for n in env_notes]
        label = str(i.index)
        if job is not None:
            changes.update(job.environment(i.index))
            label = f"rank{changes['RANK']}"
        log_path = _log_path(args, i, None if job is None else changes["RANK"])
        prefix = binding.binding_prefix(manager, i, args.bind_numa_node)
        processes.append(Process(i, [*prefix, *command], {**base, **changes}, label, log_path,
                                 pin_with_affinity=manager == "affinity"))  # fmt: skip
    return Launch(processes, settings, manager, topology, notes, prefix_output, job is not None)


def _make_log_dir(path: str) -> None:
    """Creates --log-dir (and its parents), or says in one line why it cannot be used."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        raise LaunchError(f"--log-dir {path!r} cannot be created: {error.strerror}") from error
    if not os.access(path, os.W_OK | os.X_OK):
        raise LaunchError(f"--log-dir {path!r} is not writable")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.autotune:
            from ember.launch.autotune import autotune

            return autotune(args)
        launch = prepare(args)
    except LaunchError as error:
        print(f"ember-run: error: {error}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(launch.describe())
        return 0
    for note in launch.notes:
        print(f"ember-run: note: {note}", file=sys.stderr)
    return run_processes(launch.processes, launch.prefix_output, stop_all_on_failure=launch.distributed)
