"""ember-run on this machine: real instances, checked from inside the children; exit codes, signals, logs,
autotune and a two-process DDP run over gloo."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ember.launch.topology import format_cpu_list

PROGRAMS = Path(__file__).parent / "launch_programs"
CPUS = sorted(os.sched_getaffinity(0))
two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="needs two usable CPUs")


def unset_environ(**extra: str) -> dict[str, str]:
    """This process's environment without the threading and allocator variables ember-run sets, plus ``extra``:
    ember-run keeps a variable the user set (and says so), and these tests check what it sets itself (a suite run
    with OMP_NUM_THREADS=4 must not change what they see)."""
    ours = ("OMP_", "KMP_", "GOMP_", "EMBER_", "MALLOC_CONF", "TCMALLOC_")
    return {**{k: v for k, v in os.environ.items() if not k.startswith(ours)}, **extra}


def ember_run(*argv: str, timeout: float = 240, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ember.launch", *argv], capture_output=True, text=True,
                          timeout=timeout, env=unset_environ() if env is None else env)  # fmt: skip


def placements(stdout: str) -> dict[str, dict]:
    """The JSON line of each instance, by its output prefix."""
    found = {}
    for line in stdout.splitlines():
        if line.startswith("[") and "] {" in line:
            label, payload = line[1:].split("] ", 1)
            found[label] = json.loads(payload)
    return found


@two_cpus
def test_two_instances_of_one_core_each_run_where_the_plan_says():
    run = ember_run("--ninstances", "2", "--ncores-per-instance", "1", "--memory-allocator", "default",
                    str(PROGRAMS / "report_placement.py"), "--flag", "x")  # fmt: skip
    assert run.returncode == 0, run.stderr
    seen = placements(run.stdout)
    assert sorted(seen) == ["0", "1"]
    for label, cpu in (("0", CPUS[0]), ("1", CPUS[1])):
        child = seen[label]
        assert child["affinity"] == [cpu]
        assert child["omp_num_threads"] == "1" and child["torch_threads"] == 1
        assert child["omp_places"] == "threads"  # one place a CPU of the mask the binding gave
        assert child["args"] == ["--flag", "x"]


@pytest.mark.parametrize("manager", ["taskset", "none", "auto"])
def test_every_binding_method_holds_the_instance(manager):
    run = ember_run("--ninstances", "1", "--ncores-per-instance", "1", "--multi-task-manager", manager,
                    "--memory-allocator", "default", str(PROGRAMS / "report_placement.py"))  # fmt: skip
    assert run.returncode == 0, run.stderr
    child = json.loads(run.stdout.strip().splitlines()[-1])
    # With "none" no tool binds it, but GNU OpenMP binds the main thread to the first place all the same.
    assert child["affinity"] == [CPUS[0]]
    assert child["omp_num_threads"] == "1"


@two_cpus
def test_a_second_openmp_runtime_loads_without_a_places_warning():
    pytest.importorskip("sklearn")
    run = ember_run("--memory-allocator", "default", str(PROGRAMS / "second_openmp_runtime.py"))
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "1797"
    assert "Number of places reduced" not in run.stderr, run.stderr


def test_no_omp_binding_leaves_the_instance_its_whole_cpu_set():
    run = ember_run("--no-omp-binding", "--multi-task-manager", "taskset", "--memory-allocator", "default",
                    str(PROGRAMS / "report_placement.py"))  # fmt: skip
    assert run.returncode == 0, run.stderr
    child = json.loads(run.stdout.strip().splitlines()[-1])
    assert child["affinity"] == CPUS and child["omp_places"] is None


@two_cpus
def test_dataloader_workers_get_the_instance_cpus_not_the_main_threads_one():
    # GNU OpenMP binds the main thread to the instance's first CPU; workers it forks would inherit only that CPU.
    run = ember_run("--memory-allocator", "default", str(PROGRAMS / "dataloader_workers.py"))
    assert run.returncode == 0, run.stderr
    child = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(child["instance"]) >= 2  # the physical cores: all of CPUS unless the machine has SMT
    assert len(child["main"]) == 1 and child["main"][0] in child["instance"]
    assert child["workers"] == [child["instance"]]
    assert child["pinned_child"] == child["pinned_pool"]  # empty below three CPUs


def test_the_sched_setaffinity_fallback_binds_without_any_tool():
    from ember.launch.plan import Instance
    from ember.launch.runner import Process, run_processes

    out = PROGRAMS / "report_placement.py"
    instance = Instance(0, (CPUS[-1],), (0,))
    env = unset_environ(PYTHONPATH=os.pathsep.join(sys.path))
    process = Process(instance, [sys.executable, str(out)], env, "0", pin_with_affinity=True)
    before = os.sched_getaffinity(0)
    lines = []
    assert run_processes([process], prefix_output=False, on_line=lambda p, line: lines.append(line)) == 0
    assert json.loads(lines[-1])["affinity"] == [CPUS[-1]]
    assert os.sched_getaffinity(0) == before  # the launcher's own mask is back


def test_allocator_preload_reaches_the_child():
    from ember.launch.environment import ALLOCATOR_LIBRARIES, find_library

    if find_library(ALLOCATOR_LIBRARIES["jemalloc"]) is None:
        pytest.skip("libjemalloc2 is not installed (scripts/setup.sh installs it)")
    run = ember_run("--memory-allocator", "jemalloc", str(PROGRAMS / "report_placement.py"))
    assert run.returncode == 0, run.stderr
    assert "libjemalloc.so" in json.loads(run.stdout.strip().splitlines()[-1])["ld_preload"]


@two_cpus
def test_output_goes_to_prefixed_lines_and_log_files_and_the_first_failure_is_the_exit_code(tmp_path):
    env = unset_environ(**{f"EXIT_IF_CORE_{CPUS[1]}": "3"})
    run = ember_run("--ninstances", "2", "--ncores-per-instance", "1", "--log-dir", str(tmp_path),
                    "--log-file-prefix", "trial", str(PROGRAMS / "report_placement.py"), env=env)  # fmt: skip
    assert run.returncode == 3
    logs = sorted(p.name for p in tmp_path.iterdir())
    assert logs == [f"trial_instance_0_cores_{CPUS[0]}.log", f"trial_instance_1_cores_{CPUS[1]}.log"]
    logged = json.loads((tmp_path / logs[0]).read_text())  # unprefixed
    assert logged == placements(run.stdout)["0"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_stops_every_instance_and_leaves_no_orphan(tmp_path, sig):
    launcher = subprocess.Popen([sys.executable, "-m", "ember.launch", "--ninstances", str(min(2, len(CPUS))),
                                 str(PROGRAMS / "sleep_forever.py"), str(tmp_path)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=unset_environ())  # fmt: skip
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("*.pid"))) < min(2, len(CPUS)):
        assert time.monotonic() < deadline and launcher.poll() is None
        time.sleep(0.1)
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    launcher.send_signal(sig)
    assert launcher.wait(timeout=60) != 0
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_bad_launches_exit_2_with_a_message(tmp_path):
    missing = ember_run(str(tmp_path / "nope.py"))
    assert missing.returncode == 2 and "nope.py: no such file" in missing.stderr
    too_many = ember_run("--ninstances", str(len(CPUS) + 1), str(PROGRAMS / "report_placement.py"))
    assert too_many.returncode == 2 and "more instances than" in too_many.stderr
    outside = ember_run("--cores-list", "4000", str(PROGRAMS / "report_placement.py"))
    assert outside.returncode == 2 and "outside the usable CPUs" in outside.stderr


def test_dry_run_prints_the_plan_and_starts_nothing(tmp_path):
    run = ember_run("--dry-run", "--ninstances", "1", "--memory-allocator", "default", "--no-python", "touch",
                    str(tmp_path / "ran"))  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "instance 0:" in run.stdout and "OMP_NUM_THREADS=" in run.stdout and "command:" in run.stdout
    assert not (tmp_path / "ran").exists()


def test_a_hand_set_openmp_binding_leaves_the_plan_every_cpu():
    # libgomp binds the main thread to its first place as it loads, before ember-run looks at the mask: the plan
    # must come from the CPUs the process was given (a 2-CPU machine was planned as one CPU).
    environ = unset_environ(OMP_PROC_BIND="close")
    run = ember_run("--dry-run", "--no-python", "true", env=environ)
    assert run.returncode == 0, run.stderr
    assert f"usable: {format_cpu_list(CPUS)}" in run.stdout and f"OMP_NUM_THREADS={len(CPUS)}" in run.stdout


def test_executables_run_without_python(tmp_path):
    run = ember_run("--no-python", "--ninstances", "1", "--memory-allocator", "default", "sh", "-c",
                    'echo "threads=$OMP_NUM_THREADS"')  # fmt: skip
    assert run.returncode == 0 and f"threads={len(CPUS)}" in run.stdout


@two_cpus
def test_autotune_scores_candidates_and_runs_the_best(tmp_path):
    marker = tmp_path / "final"
    # Two CPUs, whatever the machine has: 2 layouts x the allocators installed, plus the wait policies.
    run = ember_run("--autotune", "--autotune-seconds", "60", "--cores-list", f"{CPUS[0]},{CPUS[1]}",
                    str(PROGRAMS / "fake_throughput.py"), str(marker))  # fmt: skip
    assert run.returncode == 0, run.stderr
    table = run.stderr
    assert "| candidate | throughput |" in table and "| 1 x 2 cores, default |" in table
    assert ", wait passive" in table and ", OpenMP unbound" in table
    best = next(line for line in table.splitlines() if line.rstrip().endswith("best |"))
    # Each core its own instance scores 10 each (+1 with jemalloc) against 3 for one instance of both.
    assert best.startswith("| 2 x 1 cores")
    threads, preload = marker.read_text().split(" ", 1)
    assert threads == "1"
    assert ("jemalloc" in best) == ("jemalloc" in preload)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@two_cpus
def test_two_process_ddp_training_over_gloo(tmp_path):
    run = ember_run("--nproc-per-node", "2", "--ncores-per-instance", "1", "--master-port", str(free_port()),
                    "--memory-allocator", "default",
                    str(PROGRAMS / "ddp_train.py"), str(tmp_path))  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    info = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [i["world"] for i in info] == [2, 2] and [i["local_rank"] for i in info] == ["0", "1"]
    assert [i["affinity"] for i in info] == [[CPUS[0]], [CPUS[1]]] and [i["threads"] for i in info] == [1, 1]
    params = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for a, b in zip(*params):
        assert torch.equal(a, b)  # the all-reduced gradients kept the ranks in step


def test_the_quickstart_trains_and_prints_its_table_under_ember_run():
    pytest.importorskip("sklearn", reason="the digits data set ships with scikit-learn")
    quickstart = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"
    run = ember_run(str(quickstart), "--epochs", "3", "--width", "128")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "ember-run instance on CPUs" in run.stdout and "epoch 3/3" in run.stdout
    assert "| inference, batch 256" in run.stdout
    accuracies = [float(a.split("%")[0]) for a in run.stdout.split("test accuracy:")[1].split("\n")[0].split(" ")
                  if a.endswith("%") or a.endswith("%,")]  # fmt: skip
    assert len(accuracies) == 3 and min(accuracies) > 80.0  # 3 epochs of a small MLP reach ~90%: learned


@two_cpus
def test_ember_kernels_keep_the_instances_thread_count():
    run = ember_run("--ninstances", "1", "--memory-allocator", "default", str(PROGRAMS / "threads_after_ember.py"))
    assert run.returncode == 0, run.stderr
    counts = json.loads(run.stdout.strip().splitlines()[-1])
    assert counts == {"before": len(CPUS), "after": len(CPUS), "ember": len(CPUS)}
