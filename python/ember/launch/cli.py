"""ember-run: the command line. ``ember-run [options] program.py [args]``; ``ember-run --help`` for the options."""

from __future__ import annotations

import argparse
import sys

from ember.launch import binding, distributed
from ember.launch.autotune import autotune
from ember.launch.plan import LaunchError
from ember.launch.prepare import prepare
from ember.launch.runner import run_processes
from ember.launch.topology import parse_cpu_list

__all__ = ["build_parser", "main"]


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
        "(ember.launch.report_throughput prints them). docs/guides/launcher.md has the details.",
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.autotune:
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
