"""ember-run's planning on recorded topologies: core lists, NUMA nodes, environments and errors, checked against
plans written out by hand (no process is started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ember.launch.cli import build_parser
from ember.launch.environment import JEMALLOC_CONF, Settings, find_library, instance_environment, resolve_settings
from ember.launch.plan import Instance, LaunchError, Layout, plan_instances
from ember.launch.prepare import prepare
from ember.launch.topology import Topology, format_cpu_list, parse_cpu_list

TOPOLOGIES = Path(__file__).parent / "data" / "topologies"


def recorded(name: str) -> Topology:
    return Topology.from_lscpu((TOPOLOGIES / f"{name}.lscpu").read_text(), source=name)


def cpu_lists(instances: list[Instance]) -> list[str]:
    return [i.cpu_list for i in instances]


def test_cpu_lists_parse_and_format_round_trip():
    assert parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpu_list([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert parse_cpu_list(format_cpu_list(range(0, 112, 3))) == list(range(0, 112, 3))
    for bad in ("0-", "a", "3-1", "1;2"):
        with pytest.raises(ValueError, match="not a CPU list"):
            parse_cpu_list(bad)


def test_recorded_topologies_are_read_as_recorded():
    xeon = recorded("xeon-2s-56c-smt")
    assert (len(xeon.cpus), xeon.sockets, xeon.nodes, xeon.threads_per_core) == (112, [0, 1], [0, 1], 2)
    assert xeon.usable_cpus()[:3] == [0, 1, 2] and len(xeon.usable_cpus()) == 56
    assert xeon.usable_cpus(logical=True)[:4] == [0, 56, 1, 57]  # a core's siblings stay together
    container = recorded("container-cpuset-16c-smt")
    assert format_cpu_list(container.allowed) == "4-11,20-27"
    assert container.usable_cpus() == list(range(4, 12))
    xeon16 = recorded("xeon-1s-16c")
    assert (len(xeon16.cpus), xeon16.sockets, xeon16.nodes, xeon16.threads_per_core) == (16, [0], [0], 1)
    vm = recorded("zen5-vm-2c")
    assert (len(vm.cpus), vm.threads_per_core, vm.usable_cpus()) == (2, 1, [0, 1])


def test_system_topology_matches_the_affinity_mask():
    import os

    topology = Topology.from_system()
    assert topology.allowed <= set(os.sched_getaffinity(0))
    assert set(topology.usable_cpus(logical=True)) == set(topology.allowed)


# (topology, layout, expected core lists, expected NUMA nodes per instance)
PLANS = [
    ("xeon-2s-56c-smt", Layout(), ["0-55"], [(0, 1)]),
    ("xeon-2s-56c-smt", Layout(throughput_mode=True), ["0-27", "28-55"], [(0,), (1,)]),
    ("xeon-2s-56c-smt", Layout(latency_mode=True), [f"{4 * i}-{4 * i + 3}" for i in range(14)],
     [(0,)] * 7 + [(1,)] * 7),
    ("xeon-2s-56c-smt", Layout(ninstances=4, ncores_per_instance=4), ["0-3", "4-7", "8-11", "12-15"], [(0,)] * 4),
    ("xeon-2s-56c-smt", Layout(ninstances=4, ncores_per_instance=4, strategy="scatter"),
     ["0-3", "28-31", "4-7", "32-35"], [(0,), (1,), (0,), (1,)]),
    # 8 cores an instance: 3 whole slices a node (24 of 28 cores), so the 6 instances never straddle the nodes.
    ("xeon-2s-56c-smt", Layout(ncores_per_instance=8), ["0-7", "8-15", "16-23", "28-35", "36-43", "44-51"],
     [(0,)] * 3 + [(1,)] * 3),
    ("xeon-2s-56c-smt", Layout(ninstances=2, use_logical_cores=True), ["0-27,56-83", "28-55,84-111"],
     [(0,), (1,)]),
    ("xeon-2s-56c-smt", Layout(ninstances=2, ncores_per_instance=4, use_logical_cores=True),
     ["0-1,56-57", "2-3,58-59"], [(0,), (0,)]),
    ("xeon-2s-56c-smt", Layout(nodes_list=(1,), ninstances=2), ["28-41", "42-55"], [(1,), (1,)]),
    ("xeon-2s-56c-smt", Layout(cores_list=(3, 5, 30, 31), ninstances=2), ["3,5", "30-31"], [(0,), (1,)]),
    # One instance bigger than a node has to span both.
    ("xeon-2s-56c-smt", Layout(ninstances=1, ncores_per_instance=40), ["0-39"], [(0, 1)]),
    ("xeon-1s-16c", Layout(), ["0-15"], [(0,)]),
    ("xeon-1s-16c", Layout(latency_mode=True), ["0-3", "4-7", "8-11", "12-15"], [(0,)] * 4),
    ("xeon-1s-16c", Layout(ninstances=16), [str(c) for c in range(16)], [(0,)] * 16),
    ("xeon-1s-16c", Layout(ninstances=3, strategy="scatter"), ["0-4", "5-9", "10-14"], [(0,)] * 3),
    ("container-cpuset-16c-smt", Layout(), ["4-11"], [(0,)]),
    ("container-cpuset-16c-smt", Layout(latency_mode=True), ["4-7", "8-11"], [(0,), (0,)]),
    ("container-cpuset-16c-smt", Layout(ninstances=2, use_logical_cores=True), ["4-7,20-23", "8-11,24-27"],
     [(0,), (0,)]),
    ("zen5-vm-2c", Layout(), ["0-1"], [(0,)]),
    ("zen5-vm-2c", Layout(ninstances=2), ["0", "1"], [(0,), (0,)]),
    ("zen5-vm-2c", Layout(latency_mode=True), ["0-1"], [(0,)]),
]  # fmt: skip


@pytest.mark.parametrize(("name", "layout", "cores", "nodes"), PLANS)
def test_plans_on_recorded_topologies(name, layout, cores, nodes):
    instances = plan_instances(recorded(name), layout)
    assert cpu_lists(instances) == cores
    assert [i.nodes for i in instances] == nodes
    assert [i.index for i in instances] == list(range(len(instances)))


@pytest.mark.parametrize(
    ("name", "layout", "message"),
    [
        ("zen5-vm-2c", Layout(ninstances=3), "more instances than the 2 usable physical cores"),
        ("zen5-vm-2c", Layout(ncores_per_instance=3), "more than the 2 usable"),
        ("xeon-2s-56c-smt", Layout(ninstances=8, ncores_per_instance=8), "need 64 physical cores; 56 are usable"),
        ("container-cpuset-16c-smt", Layout(cores_list=(2, 3, 4)), "outside the usable CPUs 4-11,20-27: 2-3"),
        ("container-cpuset-16c-smt", Layout(cores_list=(4, 40)), "40 .*do not exist"),
        ("container-cpuset-16c-smt", Layout(cores_list=(4, 4)), "names a CPU twice"),
        ("xeon-2s-56c-smt", Layout(nodes_list=(2,)), r"NUMA nodes \[2\]; this machine has \[0, 1\]"),
        ("xeon-2s-56c-smt", Layout(throughput_mode=True, ninstances=2), "throughput-mode sets the instances"),
        ("xeon-2s-56c-smt", Layout(latency_mode=True, ncores_per_instance=2), "latency-mode runs 4 cores"),
        ("xeon-2s-56c-smt", Layout(ninstances=0), "at least 1"),
        ("xeon-2s-56c-smt", Layout(strategy="spread"), "close' or 'scatter"),
        ("xeon-2s-56c-smt", Layout(cores_list=(1,), nodes_list=(0,)), "not both"),
    ],
)
def test_impossible_plans_are_refused_with_the_reason(name, layout, message):
    with pytest.raises(LaunchError, match=message):
        plan_instances(recorded(name), layout)


GNU_JEMALLOC = Settings("gnu", "jemalloc", ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",))


def test_gnu_environment_pins_one_thread_a_cpu_and_preloads_the_allocator():
    instance = plan_instances(recorded("xeon-2s-56c-smt"), Layout(ninstances=4, ncores_per_instance=4))[1]
    changes, notes = instance_environment(GNU_JEMALLOC, instance, {"PATH": "/bin"})
    assert changes == {
        "OMP_NUM_THREADS": "4",
        "EMBER_INSTANCE_CPUS": "4-7",
        "OMP_PLACES": "threads",
        "OMP_PROC_BIND": "close",
        "OMP_SCHEDULE": "STATIC",
        "OMP_DYNAMIC": "FALSE",
        "MALLOC_CONF": JEMALLOC_CONF,
        "LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    }
    assert notes == []


def test_an_unbound_instance_names_its_cpus_as_places():
    # Without a binding the process's mask is every CPU: libgomp must be told which are the instance's.
    instance = plan_instances(recorded("xeon-2s-56c-smt"), Layout(ninstances=4, ncores_per_instance=4))[1]
    changes, _ = instance_environment(GNU_JEMALLOC, instance, {}, bound=False)
    assert changes["OMP_PLACES"] == "{4},{5},{6},{7}"


def test_intel_environment_uses_kmp_settings():
    instance = plan_instances(recorded("zen5-vm-2c"), Layout())[0]
    settings = Settings("intel", "tcmalloc", ("/opt/lib/libiomp5.so", "/usr/lib/libtcmalloc_minimal.so.4"), "passive")
    changes, _ = instance_environment(settings, instance, {})
    assert changes["KMP_AFFINITY"] == "granularity=fine,compact,1,0" and changes["KMP_BLOCKTIME"] == "0"
    assert "OMP_PLACES" not in changes and changes["OMP_NUM_THREADS"] == "2"
    assert changes["LD_PRELOAD"] == "/opt/lib/libiomp5.so:/usr/lib/libtcmalloc_minimal.so.4"
    assert "TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD" in changes


def test_variables_the_user_set_are_kept_with_a_note():
    instance = plan_instances(recorded("zen5-vm-2c"), Layout(ninstances=2))[0]
    user = {"OMP_NUM_THREADS": "7", "OMP_PROC_BIND": "close", "LD_PRELOAD": "/opt/mine.so"}
    changes, notes = instance_environment(GNU_JEMALLOC, instance, user)
    assert "OMP_NUM_THREADS" not in changes
    assert changes["OMP_PROC_BIND"] == "close"  # same value: nothing to note
    assert changes["LD_PRELOAD"] == "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2:/opt/mine.so"
    assert notes == [
        "kept OMP_NUM_THREADS=7 from your environment (ember-run would set 1)",
        "LD_PRELOAD: /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 added in front of your /opt/mine.so",
    ]


def test_allocators_are_found_or_refused_by_name(tmp_path):
    (tmp_path / "libtcmalloc_minimal.so.4").write_bytes(b"")
    dirs = [str(tmp_path)]
    assert find_library(("libjemalloc.so.2",), dirs) is None
    auto = resolve_settings("auto", "auto", dirs=dirs, torch_runtime="gnu")
    assert (auto.allocator, auto.preload) == ("tcmalloc", (str(tmp_path / "libtcmalloc_minimal.so.4"),))
    assert resolve_settings("auto", "default", dirs=dirs, torch_runtime="gnu").preload == ()
    with pytest.raises(LaunchError, match="apt-get install libjemalloc2"):
        resolve_settings("auto", "jemalloc", dirs=dirs, torch_runtime="gnu")
    with pytest.raises(LaunchError, match=r"libiomp5\.so not found"):
        resolve_settings("intel", "default", dirs=dirs, torch_runtime="gnu")
    nothing = resolve_settings("auto", "auto", dirs=[], torch_runtime="gnu")
    assert nothing.allocator == "default" and "no jemalloc or tcmalloc" in nothing.notes[0]
    # torch built on Intel OpenMP: its settings, nothing to preload for it.
    assert resolve_settings("auto", "default", dirs=[], torch_runtime="intel").omp_runtime == "intel"


def launch_of(argv: list[str], topology: str = "xeon-2s-56c-smt", environ: dict | None = None):
    args = build_parser().parse_args([*argv, __file__])
    return prepare(args, recorded(topology), environ or {}, GNU_JEMALLOC, manager="numactl")


def test_the_launch_binds_each_instance_with_numactl():
    launch = launch_of(["--ninstances", "2", "--ncores-per-instance", "4", "--strategy", "scatter",
                        "--bind-numa-node"])  # fmt: skip
    first, second = launch.processes
    assert first.command[:3] == ["numactl", "--physcpubind=0-3", "--membind=0"]
    assert second.command[:3] == ["numactl", "--physcpubind=28-31", "--membind=1"]
    assert first.command[-1] == __file__ and "-u" in first.command  # output piped: unbuffered
    assert second.env["OMP_PLACES"] == "threads"  # numactl gives the process exactly those CPUs
    assert launch.prefix_output
    text = launch.describe()
    assert "instance 1: 4 CPUs [28-31], NUMA node(s) 1" in text and "OMP_NUM_THREADS=4" in text


def test_distributed_launch_sets_ranks_and_splits_the_cores():
    launch = launch_of(["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--nproc-per-node", "2"])
    envs = [p.env for p in launch.processes]
    assert [(e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"]) for e in envs] == [("2", "0", "4"), ("3", "1", "4")]
    assert {e["MASTER_ADDR"] for e in envs} == {"10.0.0.1"} and envs[0]["MASTER_PORT"] == "29500"
    assert [p.instance.cpu_list for p in launch.processes] == ["0-27", "28-55"]
    assert [p.label for p in launch.processes] == ["rank2", "rank3"]
    # Default: one process per NUMA node.
    assert len(launch_of(["--nnodes", "1"]).processes) == 2


def test_log_files_are_named_by_instance_or_rank(tmp_path):
    logs = [
        p.log_path
        for p in launch_of(["--ninstances", "2", "--cores-list", "0-3,8", "--log-dir", str(tmp_path)]).processes
    ]
    assert logs == [str(tmp_path / "run_instance_0_cores_0-1.log"), str(tmp_path / "run_instance_1_cores_2-3.log")]
    ranks = launch_of(["--nproc-per-node", "2", "--node-rank", "1", "--nnodes", "2", "--master-addr", "a",
                       "--log-dir", str(tmp_path), "--log-file-prefix", "job"]).processes  # fmt: skip
    assert [p.log_path for p in ranks] == [str(tmp_path / "job_rank_2_cores_0-27.log"),
                                           str(tmp_path / "job_rank_3_cores_28-55.log")]  # fmt: skip


def test_hostfile_gives_nodes_master_and_this_nodes_rank(tmp_path):
    from ember.launch.distributed import plan_job

    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the job\nnode-a slots=2\nnode-b\n\nnode-c  # spare\n")
    job = plan_job(2, hostfile=str(hostfile), this_host={"node-b"})
    assert (job.nnodes, job.node_rank, job.master_addr, job.world_size) == (3, 1, "node-a", 6)
    with pytest.raises(LaunchError, match="not in --hostfile"):
        plan_job(2, hostfile=str(hostfile), this_host={"elsewhere"})
    with pytest.raises(LaunchError, match="disagrees"):
        plan_job(2, nnodes=2, hostfile=str(hostfile), this_host={"node-a"})
    with pytest.raises(LaunchError, match="needs --master-addr"):
        plan_job(1, nnodes=2)
    with pytest.raises(LaunchError, match=r"outside \[0, 2\)"):
        plan_job(1, nnodes=2, node_rank=2, master_addr="a")


def test_bad_launches_name_the_problem(tmp_path):
    parser = build_parser()
    topology = recorded("zen5-vm-2c")
    with pytest.raises(LaunchError, match="no such file"):
        prepare(parser.parse_args([str(tmp_path / "missing.py")]), topology, {}, GNU_JEMALLOC, "none")
    with pytest.raises(LaunchError, match="no such executable"):
        prepare(parser.parse_args(["--no-python", "no-such-program-xyz"]), topology, {}, GNU_JEMALLOC, "none")
    with pytest.raises(LaunchError, match="--instance-idx 2 is outside"):
        prepare(parser.parse_args(["--ninstances", "2", "--instance-idx", "2", __file__]), topology, {},
                GNU_JEMALLOC, "none")  # fmt: skip
    only = prepare(parser.parse_args(["--ninstances", "2", "--instance-idx", "1", __file__]), topology, {},
                   GNU_JEMALLOC, "none")  # fmt: skip
    assert [p.instance.cpu_list for p in only.processes] == ["1"] and not only.prefix_output


def test_cgroup_cpusets_are_read_for_v1_and_v2(tmp_path):
    from ember.launch.topology import cgroup_cpuset

    v2 = tmp_path / "v2"
    (v2 / "app").mkdir(parents=True)
    (v2 / "app" / "cpuset.cpus.effective").write_text("4-11\n")
    (tmp_path / "self-v2").write_text("0::/app\n")
    assert cgroup_cpuset(str(v2), str(tmp_path / "self-v2")) == list(range(4, 12))
    v1 = tmp_path / "v1"
    (v1 / "cpuset" / "docker" / "abc").mkdir(parents=True)
    (v1 / "cpuset" / "docker" / "abc" / "cpuset.effective_cpus").write_text("0-1,8\n")
    (tmp_path / "self-v1").write_text("4:memory:/docker/abc\n3:cpuset:/docker/abc\n0::/\n")
    assert cgroup_cpuset(str(v1), str(tmp_path / "self-v1")) == [0, 1, 8]
    assert cgroup_cpuset(str(tmp_path / "none"), str(tmp_path / "self-v1")) is None
    assert cgroup_cpuset(str(v1), str(tmp_path / "no-such-file")) is None


def test_sysfs_is_read_with_cores_numbered_across_sockets(tmp_path):
    # 2 sockets x 2 cores x 2 threads; core_id restarts at 0 on each socket, as the kernel reports it.
    cpu_root = tmp_path / "devices/system/cpu"
    (cpu_root).mkdir(parents=True)
    (cpu_root / "online").write_text("0-7\n")
    for cpu in range(8):
        topo = cpu_root / f"cpu{cpu}/topology"
        topo.mkdir(parents=True)
        socket, core = (cpu % 4) // 2, cpu % 2
        (topo / "physical_package_id").write_text(f"{socket}\n")
        (topo / "core_id").write_text(f"{core}\n")
    for node, cpus in ((0, "0-1,4-5"), (1, "2-3,6-7")):
        (tmp_path / f"devices/system/node/node{node}").mkdir(parents=True)
        (tmp_path / f"devices/system/node/node{node}/cpulist").write_text(cpus + "\n")
    topology = Topology.from_system(str(tmp_path))
    assert topology.sockets == [0, 1] and topology.nodes == [0, 1] and topology.threads_per_core == 2
    assert len({c.core for c in topology.cpus}) == 4  # (socket, core_id) pairs, not core_id alone
    assert topology.cpu(4).core == topology.cpu(0).core and topology.cpu(2).core != topology.cpu(0).core
    assert topology.cpu(6).node == 1
