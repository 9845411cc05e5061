"""ember-run --autotune: run the program briefly under candidate layouts and settings, score each by the
throughput it reports (protocol.py), print the table, and run the best.

Candidates, unless the options fix them: layouts of every usable physical core as N instances of P/N cores for
N in 1, 2, 4, ... up to one core each (plus the latency mode's 4 cores), each allocator installed; then, for the
best of those, each OpenMP wait policy and OpenMP threads left unbound (``--no-omp-binding``). A candidate runs
for --autotune-seconds with EMBER_AUTOTUNE=1 set and is then stopped; one that reports nothing, or fails, scores
nothing.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import threading
from dataclasses import dataclass, field

from ember.launch.environment import ALLOCATOR_LIBRARIES, find_library, library_dirs
from ember.launch.plan import LaunchError, Layout, pool_cpus
from ember.launch.prepare import Launch, prepare
from ember.launch.protocol import parse_throughput
from ember.launch.runner import Process, run_processes
from ember.launch.topology import Topology

__all__ = ["Candidate", "autotune", "candidates", "score"]


@dataclass
class Candidate:
    ninstances: int
    ncores: int
    allocator: str
    wait_policy: str | None = None
    omp_binding: bool = True
    reports: dict[str, list[float]] = field(default_factory=dict)
    unit: str = ""
    exit_code: int = 0

    @property
    def name(self) -> str:
        wait = f", wait {self.wait_policy}" if self.wait_policy else ""
        unbound = ", OpenMP unbound" if not self.omp_binding else ""
        return f"{self.ninstances} x {self.ncores} cores, {self.allocator}{wait}{unbound}"


def score(reports: dict[str, list[float]], instances: int) -> float | None:
    """The protocol's score: per instance the median report after the first (warm-up), summed; None unless every
    instance reported."""
    if len(reports) < instances or any(not r for r in reports.values()):
        return None
    return sum(statistics.median(r[1:] if len(r) > 1 else r) for r in reports.values())


def candidates(args: argparse.Namespace, topology: Topology, allocators: list[str]) -> list[Candidate]:
    """The layouts and allocators to try (the options the user gave stay fixed)."""
    pool = len(pool_cpus(topology, Layout(cores_list=args.cores_list, nodes_list=args.nodes_list,
                                          use_logical_cores=args.use_logical_cores)))  # fmt: skip
    if args.ninstances is not None or args.ncores_per_instance is not None:
        count = args.ninstances or pool // args.ncores_per_instance
        layouts = [(count, args.ncores_per_instance or pool // count)]
    else:
        sizes = {pool, min(4, pool), 1}
        n = 1
        while n <= pool:
            sizes.add(pool // n)
            n *= 2
        layouts = sorted({(pool // k, k) for k in sizes if k >= 1}, key=lambda layout: layout[0])
    chosen = allocators if args.memory_allocator == "auto" else [args.memory_allocator]
    return [Candidate(n, k, a, args.omp_wait_policy, not args.no_omp_binding) for n, k in layouts for a in chosen]


def _options(args: argparse.Namespace, candidate: Candidate) -> argparse.Namespace:
    """The user's options with the candidate's layout and settings in place of theirs."""
    chosen = copy.copy(args)
    chosen.autotune = False
    chosen.ninstances, chosen.ncores_per_instance = candidate.ninstances, candidate.ncores
    chosen.latency_mode = chosen.throughput_mode = False
    chosen.memory_allocator, chosen.omp_wait_policy = candidate.allocator, candidate.wait_policy
    chosen.no_omp_binding = not candidate.omp_binding
    return chosen


def _run_candidate(args: argparse.Namespace, candidate: Candidate, launch_of: Launch) -> None:
    trial = _options(args, candidate)
    trial.autotune = True  # so the program runs unbuffered: its reports must arrive before the time limit stops it
    trial.log_dir = None
    # The machine and the binding method were settled by the first plan; only the layout and settings change.
    launch = prepare(trial, launch_of.topology, manager=launch_of.manager)
    lock = threading.Lock()

    def on_line(process: Process, line: str) -> None:
        parsed = parse_throughput(line)
        if parsed is not None:
            with lock:
                candidate.reports.setdefault(process.label, []).append(parsed[0])
                candidate.unit = parsed[1]

    for p in launch.processes:
        p.env["EMBER_AUTOTUNE"] = "1"
        candidate.reports.setdefault(p.label, [])
    candidate.exit_code = run_processes(launch.processes, prefix_output=True, time_limit=args.autotune_seconds,
                                        on_line=on_line)  # fmt: skip


def autotune(args: argparse.Namespace) -> int:
    topology = Topology.from_system()
    dirs = library_dirs()
    allocators = ["default"] + [a for a in ("jemalloc", "tcmalloc") if find_library(ALLOCATOR_LIBRARIES[a], dirs)]
    if args.autotune_seconds <= 0:
        raise LaunchError(f"--autotune-seconds must be positive, got {args.autotune_seconds}")
    tried = candidates(args, topology, allocators)
    first = prepare(args, topology)  # the options themselves must make sense before anything runs
    print(f"ember-run --autotune: {len(tried)} candidates, {args.autotune_seconds:g} s each", file=sys.stderr)
    for candidate in tried:
        print(f"ember-run --autotune: trying {candidate.name}", file=sys.stderr, flush=True)
        _run_candidate(args, candidate, first)
    best = _best(tried)
    # Then the OpenMP settings, on the best layout and allocator.
    variants = [] if best is None else [
        *(() if args.omp_wait_policy else ((policy, best.omp_binding) for policy in ("active", "passive"))),
        *(() if args.no_omp_binding else ((best.wait_policy, False),)),
    ]  # fmt: skip
    for policy, binding in variants:
        assert best is not None
        candidate = Candidate(best.ninstances, best.ncores, best.allocator, policy, binding)
        print(f"ember-run --autotune: trying {candidate.name}", file=sys.stderr, flush=True)
        _run_candidate(args, candidate, first)
        tried.append(candidate)
    best = _best(tried)
    print(_table(tried, best), file=sys.stderr, flush=True)
    if best is None:
        print("ember-run --autotune: no candidate reported a throughput (print 'EMBER_THROUGHPUT <number>' lines, "
              "or call ember.launch.report_throughput)", file=sys.stderr)  # fmt: skip
        return 1
    launch = prepare(_options(args, best), topology, manager=first.manager)
    print(f"ember-run --autotune: running the best, {best.name}", file=sys.stderr, flush=True)
    if args.dry_run:
        print(launch.describe())
        return 0
    return run_processes(launch.processes, launch.prefix_output, stop_all_on_failure=launch.distributed)


def _best(tried: list[Candidate]) -> Candidate | None:
    scored = [(s, c) for c in tried if (s := score(c.reports, c.ninstances)) is not None and c.exit_code == 0]
    return max(scored, key=lambda sc: sc[0])[1] if scored else None


def _table(tried: list[Candidate], best: Candidate | None) -> str:
    lines = ["| candidate | throughput | reports | |", "|---|---|---|---|"]
    for c in tried:
        s = score(c.reports, c.ninstances)
        shown = f"{s:.4g} {c.unit}".strip() if s is not None else "none"
        if c.exit_code:
            shown += f" (exit {c.exit_code})"
        count = sum(len(r) for r in c.reports.values())
        lines.append(f"| {c.name} | {shown} | {count} | {'best' if c is best else ''} |")
    return "\n".join(lines)
