"""ember-run under faults: a child's exit code and death by signal reach the caller, and unknown flags or impossible
layouts are refused with a one-line error and a non-zero exit. (SIGINT and SIGTERM stopping every child:
test_launch_runs.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
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
