"""ember-run under faults: a child's exit code and death by signal reach the caller, SIGINT stops every child and
leaves no orphan, and unknown flags or impossible layouts are refused with a one-line error and a non-zero exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PROGRAMS = Path(__file__).parent.parent / "launch_programs"
CPUS = sorted(os.sched_getaffinity(0))


def ember_run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ember.launch", *argv], capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize(("script", "code"), [("exit 7", 7), ("kill -KILL $$", 128 + 9), ("kill -TERM $$", 128 + 15)])
def test_a_childs_exit_code_and_signal_reach_the_caller(script, code):
    run = ember_run("--ninstances", "1", "--memory-allocator", "default", "--no-python", "sh", "-c", script)
    assert run.returncode == code, run.stderr


def test_sigint_stops_every_child_and_leaves_no_orphan(tmp_path):
    instances = min(2, len(CPUS))
    launcher = subprocess.Popen([sys.executable, "-m", "ember.launch", "--ninstances", str(instances),
                                 str(PROGRAMS / "sleep_forever.py"), str(tmp_path)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("*.pid"))) < instances:
        assert time.monotonic() < deadline and launcher.poll() is None
        time.sleep(0.1)
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    launcher.send_signal(signal.SIGINT)
    assert launcher.wait(timeout=60) != 0
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--no-such-flag", "x.py"], "unrecognized arguments"),
        (["--ninstances", str(len(CPUS) + 1), "x.py"], "more instances than"),
        (["--memory-allocator", "nonesuch", "x.py"], "memory-allocator"),
        (["--ncores-per-instance", "0", "x.py"], "ncores"),
    ],
)
def test_unknown_flags_and_impossible_layouts_are_refused_in_one_line(argv, message, tmp_path):
    (tmp_path / "x.py").write_text("print('ran')\n")
    run = subprocess.run([sys.executable, "-m", "ember.launch", *argv], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)  # fmt: skip
    assert run.returncode != 0 and "ran" not in run.stdout
    errors = [line for line in run.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and message in errors[0], run.stderr
    assert "Traceback" not in run.stderr
