"""ember.runtime: CPU pools, pinned threads (checked through the OS), tasks and multi-stream modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import namedtuple
from pathlib import Path

import pytest
import torch

import ember
from ember import _C
from ember.runtime import CPUPool, MultiStreamModule, Task, pin

CPUS = sorted(os.sched_getaffinity(0))

sys.path.insert(0, str(Path(__file__).parent / "launch_programs"))
from forked_affinity import fork_and_report_affinity  # noqa: E402 - shared with the programs ember-run starts


def os_mask(native_id: int) -> set[int]:
    """The thread's affinity as /proc reports it."""
    status = Path(f"/proc/self/task/{native_id}/status").read_text()
    text = next(line.split(":", 1)[1].strip() for line in status.splitlines() if line.startswith("Cpus_allowed_list"))
    return set(ember.launch.topology.parse_cpu_list(text))


def on_thread(fn):
    """Runs fn on a fresh thread (pins never touch the test runner's thread) and returns or raises its result."""
    result = {}

    def body():
        try:
            result["value"] = fn()
        except BaseException as error:
            result["error"] = error

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


BINDING_VARIABLES = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY", "EMBER_INSTANCE_CPUS")


def cpus_in_a_child(environ: dict[str, str]) -> tuple[set[int], set[int], int]:
    """A fresh Python's main-thread mask, ember's process_cpus() and config's CPU count, under ``environ``."""
    code = (
        "import json, os, ember; from ember.runtime.cpu_pool import process_cpus; "
        "print(json.dumps([sorted(os.sched_getaffinity(0)), sorted(process_cpus()), "
        "ember.config()['threads']['cpus_allowed']]))"
    )
    inherited = {k: v for k, v in os.environ.items() if k not in BINDING_VARIABLES}  # (ember-run sets them)
    run = subprocess.run([sys.executable, "-c", code], env={**inherited, **environ}, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr
    main_mask, process, allowed = json.loads(run.stdout.splitlines()[-1])
    return set(main_mask), set(process), allowed


@pytest.mark.parametrize(
    "binding",
    [
        {"OMP_PROC_BIND": "close"},
        {"OMP_PROC_BIND": "spread", "OMP_PLACES": "cores"},
        {"GOMP_CPU_AFFINITY": ember.launch.topology.format_cpu_list(CPUS)},
    ],
    ids=["proc-bind", "places-cores", "gomp-cpu-affinity"],
)
def test_the_process_keeps_its_cpus_under_a_hand_set_openmp_binding(binding):
    # libgomp binds the main thread to its first place as it loads (import torch): the CPUs the process was given
    # are then those of OpenMP's places, not the main thread's mask.
    main_mask, process, allowed = cpus_in_a_child(binding)
    assert process == set(CPUS) and allowed == len(CPUS)
    if len(CPUS) > 1:
        assert main_mask < set(CPUS)  # the binding did happen: the main thread's mask alone would have misled


def test_openmp_places_narrower_than_the_mask_are_the_processs_cpus():
    # The places a user gave OpenMP are the CPUs the program's threads will run on; unbound, the main thread's mask.
    _, process, _ = cpus_in_a_child({"OMP_PROC_BIND": "true", "OMP_PLACES": f"{{{CPUS[-1]}}}"})
    assert process == {CPUS[-1]}
    _, unbound, _ = cpus_in_a_child({})
    assert unbound == set(CPUS) == set(_C.process_cpus())


@pytest.mark.parametrize(
    "inherited, environ, pinned, expected",
    [
        ({3}, {"EMBER_INSTANCE_CPUS": "2-5"}, None, {2, 3, 4, 5}),  # OpenMP's main-thread binding: widened
        ({2}, {"EMBER_INSTANCE_CPUS": "2,8,9"}, None, {2, 8, 9}),
        ({2, 3}, {"EMBER_INSTANCE_CPUS": "2-5"}, None, None),  # the program's own mask of two: kept
        ({2, 3, 4, 5}, {"EMBER_INSTANCE_CPUS": "2-5"}, None, None),  # unbound (--no-omp-binding): nothing to do
        ({2}, {"EMBER_INSTANCE_CPUS": "2"}, None, None),  # a one-CPU instance
        ({7}, {"EMBER_INSTANCE_CPUS": "2-5"}, None, None),  # moved off the instance by the program: its business
        ({3}, {}, None, None),  # not under ember-run
        ({4}, {"EMBER_INSTANCE_CPUS": "2-5"}, (4, 5), {4, 5}),  # forked inside pin(pool): the pool
        ({4}, {}, (4, 5), {4, 5}),  # pins work outside ember-run too
        ({4}, {"EMBER_INSTANCE_CPUS": "2-5"}, (4,), None),  # pinned to one CPU on purpose: kept
    ],
)
def test_forked_children_get_their_pool_or_instance_back(inherited, environ, pinned, expected):
    assert ember.runtime.child_affinity.cpus_for_child(inherited, environ, pinned) == expected


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two usable CPUs")
def test_a_process_forked_inside_a_pin_runs_on_the_whole_pool():
    pool = CPUPool(core_ids=CPUS[:2])

    def fork_pinned():
        with pin(pool):
            assert os_mask(threading.get_native_id()) == {CPUS[0]}  # the thread itself sits on the first CPU
            return fork_and_report_affinity()

    assert on_thread(fork_pinned) == CPUS[:2]


def test_pools_hold_usable_cpus_and_refuse_others():
    pool = CPUPool()
    assert set(pool.core_ids) <= set(CPUS) and len(pool) >= 1
    assert CPUPool(core_ids=[CPUS[-1]]).core_ids == (CPUS[-1],)
    assert CPUPool(node_id=0).core_ids and CPUPool(node_id=0).node_id == 0
    with pytest.raises(ValueError, match="outside the ones this process may use"):
        CPUPool(core_ids=[max(CPUS) + 1000])
    with pytest.raises(ValueError, match="twice"):
        CPUPool(core_ids=[CPUS[0], CPUS[0]])
    with pytest.raises(ValueError, match="empty"):
        CPUPool(core_ids=[])
    with pytest.raises(ValueError, match="not both"):
        CPUPool(core_ids=[CPUS[0]], node_id=0)
    with pytest.raises(ValueError, match="not a NUMA node"):
        CPUPool(node_id=4096)
    parts = CPUPool(core_ids=CPUS).split(len(CPUS))
    assert [p.core_ids for p in parts] == [(c,) for c in CPUS]
    with pytest.raises(ValueError, match="parts must be in"):
        pool.split(len(pool) + 1)


@pytest.mark.parametrize("backend", ["openmp", "tbb"])
def test_pin_moves_the_thread_and_its_kernels_and_puts_them_back(backend):
    cpus = CPUS[-2:] if len(CPUS) > 2 else CPUS[-1:]  # never all of them, where there are more than one
    x = torch.randn(512, 512)
    expected = torch.nn.functional.gelu(x @ x)

    def work():
        before_mask, before_threads = os_mask(threading.get_native_id()), torch.get_num_threads()
        with pin(CPUPool(core_ids=cpus)) as pool:
            assert pool.core_ids == tuple(cpus)
            assert os_mask(threading.get_native_id()) == {cpus[0]}
            assert torch.get_num_threads() == len(cpus)
            assert _C.team_affinity(len(cpus)) == [[c] for c in cpus]
            assert _C.pinned_cpus() == cpus
            bits = ember.bf16.split(x)[0]  # an ember kernel, parallel over the pool
            result = torch.nn.functional.gelu(x @ x)
        assert os_mask(threading.get_native_id()) == before_mask
        assert torch.get_num_threads() == before_threads and _C.pinned_cpus() == []
        return bits, result

    saved = _C.threading_backend()
    _C.set_threading_backend(backend)
    try:
        bits, result = on_thread(work)
    finally:
        _C.set_threading_backend(saved)
    torch.testing.assert_close(result, expected)
    assert torch.equal(bits, ember.bf16.split(x)[0])


def test_pins_nest_and_work_as_decorators():
    outer, inner = CPUPool(core_ids=CPUS), CPUPool(core_ids=[CPUS[-1]])

    @pin(inner)
    def innermost():
        return os_mask(threading.get_native_id()), torch.get_num_threads()

    def work():
        with pin(outer):
            assert innermost() == ({CPUS[-1]}, 1)
            assert torch.get_num_threads() == len(CPUS) and _C.pinned_cpus() == CPUS
        return _C.pinned_cpus()

    assert on_thread(work) == []
    with pytest.raises(TypeError, match="CPUPool"):
        pin([0])


def test_tasks_run_on_their_pool_concurrently_and_return_futures():
    pools = [CPUPool(core_ids=[c]) for c in CPUS[:2]] if len(CPUS) > 1 else [CPUPool(core_ids=CPUS)] * 2
    meeting = threading.Barrier(2, timeout=30)

    def placed(tag):
        meeting.wait()  # both tasks must be running at once to get past this
        return tag, os_mask(threading.get_native_id()), torch.get_num_threads(), torch.is_grad_enabled()

    tasks = [Task(placed, pool) for pool in pools]
    with torch.no_grad():
        futures = [task(i) for i, task in enumerate(tasks)]
    results = [f.get(timeout=60) for f in futures]
    for (tag, mask, threads, grad), pool, i in zip(results, pools, range(2)):
        assert (tag, mask, threads, grad) == (i, {pool.core_ids[0]}, 1, False)
    for task in tasks:
        task.close()
    with pytest.raises(RuntimeError, match="after close"):
        tasks[0](0)


def test_task_errors_and_module_results_come_back_through_the_future():
    model = torch.nn.Linear(8, 4).eval()
    x = torch.randn(3, 8)
    with Task(model, CPUPool(core_ids=[CPUS[0]])) as task:
        with torch.no_grad():
            torch.testing.assert_close(task.run_sync(x), model(x))
        future = task(torch.randn(3, 5))
        with pytest.raises(RuntimeError):
            future.get()
    with pytest.raises(TypeError, match="callable"):
        Task(3, CPUPool())


Pair = namedtuple("Pair", "logits features")


class TwoOutputs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Dropout(0.1))
        self.head = torch.nn.Linear(32, 5)

    def forward(self, x, scale=1.0):
        features = self.body(x)
        return Pair(self.head(features) * scale, {"features": features, "norm": features.norm(dim=1)})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_multi_stream_module_gives_the_models_results(dtype):
    torch.manual_seed(0)
    model = ember.optimize(TwoOutputs().eval(), dtype=dtype)
    streams = MultiStreamModule(model, num_streams=len(CPUS), cpu_pool=CPUPool(core_ids=CPUS))
    try:
        for batch in (1, 2, 3, 7):
            x = torch.randn(batch, 16)
            with torch.no_grad():
                expected, got = model(x, scale=2.0), streams(x, scale=2.0)
            assert isinstance(got, Pair) and set(got.features) == {"features", "norm"}
            # Each row is computed alone or with others; the kernels' row blocking may differ, hence close, not equal.
            tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1e-2}
            torch.testing.assert_close(got.logits, expected.logits, **tol)
            torch.testing.assert_close(got.features["norm"], expected.features["norm"], **tol)
    finally:
        streams.close()


def test_multi_stream_module_splits_batches_over_at_most_that_many_streams():
    seen = []

    def record(x):
        seen.append((x.shape[0], frozenset(os.sched_getaffinity(0))))
        return x * 2

    streams = MultiStreamModule(record, num_streams=len(CPUS), cpu_pool=CPUPool(core_ids=CPUS), concat_output=False)
    outputs = streams(torch.arange(5.0).unsqueeze(1))
    used = min(5, len(CPUS))  # a batch smaller than the stream count uses one stream a sample
    assert [o.shape[0] for o in outputs] == [5 // used + (i < 5 % used) for i in range(used)]
    assert torch.equal(torch.cat(outputs), torch.arange(5.0).unsqueeze(1) * 2)
    assert {frozenset({c}) for c in CPUS[:used]} == {mask for _, mask in seen}
    seen.clear()
    assert len(streams(torch.ones(1, 1))) == 1 and len(seen) == 1
    streams.close()
    with pytest.raises(ValueError, match="streams need at least as many CPUs"):
        MultiStreamModule(record, num_streams=len(CPUS) + 1, cpu_pool=CPUPool(core_ids=CPUS))
    with pytest.raises(ValueError, match="positive int or 'AUTO'"):
        MultiStreamModule(record, num_streams=0)
    with pytest.raises(ValueError, match="no tensor argument"):
        MultiStreamModule(record, num_streams=1)(3)
    auto = MultiStreamModule(record)
    assert auto.num_streams == max(1, len(CPUPool()) // 4)
    auto.close()
