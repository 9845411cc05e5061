"""Starting and watching the instances.

Every instance runs in its own process group, so that a signal for the launcher is forwarded once to each
instance's whole tree: Ctrl-C or SIGTERM stops them all (a second Ctrl-C, or 10 s without an exit, kills them).
With several instances, or a log directory, each output line goes to the terminal behind an "[i]" prefix and,
unprefixed, to the instance's log file; a single instance without logs writes to the terminal directly, so
progress bars and prompts work. The launcher's exit code is the first non-zero exit of an instance (128 + N for
one killed by signal N).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import BinaryIO, Callable

from ember.launch.plan import Instance

__all__ = ["Process", "run_processes"]

GRACE_SECONDS = 10.0


@dataclass
class Process:
    """One process to start: its instance, full command and environment, and where its output goes."""

    instance: Instance
    command: list[str]
    env: dict[str, str]
    label: str
    log_path: str | None = None
    pin_with_affinity: bool = False  # bind by the launcher's own sched_setaffinity before starting it
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _pump(process: Process, stream: BinaryIO, prefix: bool, lock: threading.Lock,
          on_line: Callable[[Process, str], None] | None) -> None:  # fmt: skip
    log = open(process.log_path, "wb") if process.log_path else None  # noqa: SIM115 - closed below
    try:
        for line in iter(stream.readline, b""):
            if log:
                log.write(line)
                log.flush()
            if on_line is not None:
                on_line(process, line.decode(errors="replace"))
            with lock:
                out = sys.stdout.buffer
                out.write((f"[{process.label}] ".encode() if prefix else b"") + line)
                out.flush()
    finally:
        if log:
            log.close()


def _start(process: Process, capture: bool) -> subprocess.Popen[bytes]:
    saved = None
    if process.pin_with_affinity:  # the child inherits the mask of the thread that forks it
        saved = os.sched_getaffinity(0)
        os.sched_setaffinity(0, process.instance.cpus)
    try:
        return subprocess.Popen(
            process.command,
            env=process.env,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.STDOUT if capture else None,
            start_new_session=True,
        )
    finally:
        if saved is not None:
            os.sched_setaffinity(0, saved)


def _signal_all(processes: list[Process], sig: int) -> None:
    for p in processes:
        if p.popen is not None and p.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.popen.pid, sig)


def run_processes(
    processes: list[Process],
    prefix_output: bool,
    stop_all_on_failure: bool = False,
    time_limit: float | None = None,
    on_line: Callable[[Process, str], None] | None = None,
) -> int:
    """Starts every process, forwards signals, waits for all, and returns the launch's exit code.

    Args:
        prefix_output: pipe each process's output through the launcher with an "[label]" prefix.
        stop_all_on_failure: when one process fails, stop the others (a distributed job cannot go on).
        time_limit: stop every process after this many seconds (autotune candidates); a process stopped so
            counts as a success.
        on_line: called with each output line (implies capturing the output).
    """
    capture = prefix_output or on_line is not None or any(p.log_path for p in processes)
    lock = threading.Lock()
    pumps = []
    stop_requests: list[int] = []

    def handle(signum: int, frame: object) -> None:
        stop_requests.append(signum)
        _signal_all(processes, signal.SIGKILL if len(stop_requests) > 1 and signum == signal.SIGINT else signum)

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    in_main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, handle) for s in handled} if in_main else {}
    first_failure = 0
    try:
        for p in processes:
            p.popen = _start(p, capture)
            if capture:
                assert p.popen.stdout is not None
                pump = threading.Thread(target=_pump, args=(p, p.popen.stdout, prefix_output, lock, on_line),
                                        daemon=True)  # fmt: skip
                pump.start()
                pumps.append(pump)
        started = time.monotonic()
        stopping_since: float | None = None
        timed_out = False
        while True:
            running = [p for p in processes if p.popen is not None and p.popen.poll() is None]
            for p in processes:
                code = p.popen.returncode if p.popen is not None else None
                if code not in (None, 0) and first_failure == 0 and not timed_out:
                    first_failure = _exit_code(code)
                    if stop_all_on_failure and running:
                        print(f"ember-run: instance {p.label} exited with {first_failure}; stopping the others",
                              file=sys.stderr, flush=True)  # fmt: skip
                        _signal_all(processes, signal.SIGTERM)
                        stopping_since = time.monotonic()
            if not running:
                break
            now = time.monotonic()
            if time_limit is not None and not timed_out and now - started > time_limit:
                timed_out = True
                _signal_all(processes, signal.SIGTERM)
                stopping_since = now
            if stop_requests and stopping_since is None:
                stopping_since = now
            if stopping_since is not None and now - stopping_since > GRACE_SECONDS:
                _signal_all(processes, signal.SIGKILL)
            time.sleep(0.02)
        for pump in pumps:
            pump.join()
    finally:
        for p in processes:
            if p.popen is not None and p.popen.stdout is not None:
                p.popen.stdout.close()
        _signal_all(processes, signal.SIGKILL)  # only if the launcher itself failed while they ran
        for s, h in previous.items():
            signal.signal(s, h)
    if first_failure:
        return first_failure
    if stop_requests and not timed_out:
        return 128 + stop_requests[0]
    return 0
