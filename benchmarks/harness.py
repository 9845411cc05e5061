"""The benchmark harness every ember benchmark uses (docs/architecture.md, "Performance protocol").

It describes the machine, times candidates side by side in one process after warm-up (medians and spread),
measures the physical ceiling in the same run, and writes markdown and CSV into benchmarks/results/ named by
benchmark and machine:

    bench = Benchmark("bf16", "fp32 <-> bf16 conversion, 64M elements")
    stream = bench.stream_ceiling()                  # GB/s of an in-place a += b far beyond the LLC
    t = bench.time(lambda: ember.bf16.round(x, out=o))
    bench.add(op="round", impl="ember", time=t, bytes=6 * n)   # GB/s and % of ceiling filled in
    bench.write()
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import ember
from ember.runtime.cpu_pool import process_cpus

RESULTS = Path(__file__).resolve().parent / "results"


@dataclasses.dataclass(frozen=True)
class Timing:
    """Seconds per call: the median and the 10th/90th percentiles over `samples` timed batches."""

    median: float
    p10: float
    p90: float
    samples: int

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: how noisy the measurement was."""
        return (self.p90 - self.p10) / self.median if self.median > 0 else 0.0


def time_call(fn: Callable[[], Any], *, min_time: float = 0.5, warmup: int = 3, max_samples: int = 200) -> Timing:
    """Times `fn` after `warmup` calls. Short calls are batched so each sample lasts at least ~1 ms (timer noise)."""
    for _ in range(warmup):
        fn()
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-9)
    batch = max(1, int(1e-3 / once))
    samples: list[float] = []
    deadline = time.perf_counter() + min_time
    while len(samples) < 5 or (time.perf_counter() < deadline and len(samples) < max_samples):
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter() - t0) / batch)
    return _timing(samples)


def time_interleaved(
    cases: dict[str, Callable[[], Any]], *, rounds: int = 12, min_time: float = 3.0, warmup: int = 2
) -> dict[str, Timing]:
    """Times several cases round-robin, so that they all see the same machine.

    On a shared or virtual machine bandwidth drifts by tens of percent within a minute; timing one case after
    another would credit that drift to whichever case ran at a good moment. Here each round gives every case an
    equal slice of time, in an order rotated every round, and each case's statistics pool its samples over all
    rounds. Put the ceiling among the cases to compare each case with the ceiling of the same moments.
    """
    for fn in cases.values():
        for _ in range(warmup):
            fn()
    names = list(cases)
    samples: dict[str, list[float]] = {name: [] for name in names}
    batch: dict[str, int] = {}
    for name, fn in cases.items():
        start = time.perf_counter()
        fn()
        batch[name] = max(1, int(1e-3 / max(time.perf_counter() - start, 1e-9)))
    slice_time = min_time / rounds / len(names)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn, deadline = cases[name], time.perf_counter() + slice_time
            while True:
                t0 = time.perf_counter()
                for _ in range(batch[name]):
                    fn()
                samples[name].append((time.perf_counter() - t0) / batch[name])
                if time.perf_counter() >= deadline:
                    break
    return {name: _timing(values) for name, values in samples.items()}


def _timing(samples: list[float]) -> Timing:
    samples = sorted(samples)
    q = statistics.quantiles(samples, n=10) if len(samples) >= 10 else [samples[0]] * 4 + [samples[-1]] * 5
    return Timing(statistics.median(samples), q[0], q[-1], len(samples))


def stream_kernel(elements: int = 64 * 2**20) -> tuple[Callable[[], Any], int]:
    """The memory-ceiling kernel (in-place a += b on fp32 arrays far beyond the LLC) and the bytes it moves."""
    a = torch.rand(elements)
    b = torch.rand(elements)
    return (lambda: a.add_(b)), 12 * elements


def cache_kernel(elements: int, repeats: int = 10) -> tuple[Callable[[], Any], int]:
    """The cache ceiling: in-place a += b on fp32 arrays of `elements` each, `repeats` times in a row (the first
    call after other work may find them evicted; the rest read them from the cache), and the bytes it moves."""
    a = torch.rand(elements)
    b = torch.rand(elements)

    def passes() -> None:
        for _ in range(repeats):
            a.add_(b)

    return passes, 12 * elements * repeats


def machine() -> dict[str, Any]:
    """CPU model, cores, ISA and library versions: printed at the top of every result."""
    feats = ember.cpu_features()
    cfg = ember.config()
    physical = _physical_cores()
    return {
        "cpu": feats["brand"] or platform.processor(),
        "vendor": feats["vendor"],
        "physical_cores": physical,
        # The process's CPUs, not the main thread's mask: under ember-run GNU OpenMP pins the main thread to one.
        "cpus_allowed": len(process_cpus()),
        "threads": torch.get_num_threads(),
        "isa": ember.isa.detected_isa(),
        "features": " ".join(k for k, v in feats.items() if v is True),
        "torch": torch.__version__,
        "onednn": f"{cfg['onednn']['version']} ({cfg['onednn']['cpu_runtime']}, {cfg['onednn']['cpu_isa']})",
        "tbb": cfg["tbb"]["version"],
        "ember": ember.__version__,
        "python": platform.python_version(),
        "allocator": _allocator(),
        "last-level cache": f"{last_level_cache_bytes() / 2**20:.0f} MiB",
    }


def last_level_cache_bytes() -> int:
    """The size of the cache the process's first CPU shares (ember's own reading of sysfs, the streaming-store
    threshold's default). Benchmarks of memory-bound kernels size their working sets by it: the 16-core Xeon's is
    300 MiB, as large as a DLRM batch's rows; the Zen 5 VM's 32 MiB."""
    return ember._C.last_level_cache_bytes()


def _allocator() -> str:
    """The malloc in use: a preloaded jemalloc or tcmalloc (as ember-run sets it), else glibc's."""
    for name in ("jemalloc", "tcmalloc"):
        if name in os.environ.get("LD_PRELOAD", ""):
            return name
    return "glibc malloc"


def machine_tag() -> str:
    """A short file-name tag: vendor, ember's ISA level, cores, torch's major version, and a preloaded allocator;
    e.g. intel-amx-16c-torch2, or intel-amx-16c-torch2-jemalloc under ember-run."""
    m = machine()
    vendor = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}.get(m["vendor"], "cpu")
    torch_major = torch.__version__.split(".")[0]
    allocator = "" if m["allocator"] == "glibc malloc" else f"-{m['allocator']}"
    return f"{vendor}-{m['isa']}-{m['cpus_allowed']}c-torch{torch_major}{allocator}"


def stream_ceiling(elements: int = 64 * 2**20, min_time: float = 1.0) -> float:
    """Memory bandwidth in GB/s of an in-place `a += b` over two fp32 arrays far larger than the last-level cache.

    Counts 12 bytes per element (read a, read b, write a). A plain copy under-counts what the memory system
    moves, because its write-allocate reads are not counted, so kernels that update in place (optimizers) appear
    to beat it. Runs on torch.get_num_threads() threads, the budget ember's kernels use too.
    """
    fn, nbytes = stream_kernel(elements)
    return nbytes / time_call(fn, min_time=min_time).median / 1e9


def gemm_ceiling(
    n: int = 2048, min_time: float = 1.0, dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)
) -> dict[str, float]:
    """Peak GEMM GFLOP/s through torch, n x n x n, per dtype (a bf16 mm takes minutes without AVX-512: ask only for
    the dtypes measured). The rate of the fastest tenth of the samples: a ceiling is what the machine can do, and on
    a shared machine a median taken in a slow second read half the usual rate (the Xeon's bf16 ceiling once came out
    at 2060 GFLOP/s against 3645-3874 in the runs before)."""
    out = {}
    for dtype in dtypes:
        a = torch.randn(n, n).to(dtype)
        b = torch.randn(n, n).to(dtype)
        t = time_call(lambda: torch.mm(a, b), min_time=min_time, warmup=2)  # noqa: B023 - called right here
        out[str(dtype).replace("torch.", "")] = 2 * n**3 / t.p10 / 1e9
    return out


class Benchmark:
    """Collects rows of one benchmark run and writes them with the machine and the ceilings."""

    def __init__(self, name: str, title: str, part: str = "") -> None:
        self.name = name
        self.title = title
        self.part = part  # a run of a subset, written beside the others: results/<name>-<part>-<machine>.md
        self.rows: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.ceilings: dict[str, str] = {}
        self.stream_gbs: float | None = None
        self.started = datetime.datetime.now(datetime.timezone.utc)
        m = machine()
        print(f"# {title}\n{m['cpu']} | {m['cpus_allowed']} CPUs, {m['threads']} threads | ISA {m['isa']} | "
              f"torch {m['torch']} | oneDNN {m['onednn']} | oneTBB {m['tbb']} | ember {m['ember']}")  # fmt: skip

    def stream_ceiling(self, **kwargs: Any) -> float:
        self.stream_gbs = stream_ceiling(**kwargs)
        self.ceilings["memory (in-place a += b, 12 B/elem)"] = f"{self.stream_gbs:.1f} GB/s"
        print(f"ceiling: memory {self.stream_gbs:.1f} GB/s (in-place a += b)")
        return self.stream_gbs

    def gemm_ceiling(self, **kwargs: Any) -> dict[str, float]:
        peaks = gemm_ceiling(**kwargs)
        for dtype, gflops in peaks.items():
            self.ceilings[f"GEMM {dtype} (torch.mm)"] = f"{gflops:.0f} GFLOP/s"
        print("ceiling: " + ", ".join(f"GEMM {k} {v:.0f} GFLOP/s" for k, v in peaks.items()))
        return peaks

    time = staticmethod(time_call)
    interleaved = staticmethod(time_interleaved)

    def add(
        self,
        *,
        time: Timing,
        bytes: float | None = None,  # noqa: A002 - the natural name
        baseline: Timing | None = None,
        ceiling_gbs: float | None = None,
        after: dict[str, Any] | None = None,
        **fields: Any,
    ) -> None:
        """Adds a row: `fields` name the case; `bytes` (moved per call) adds GB/s and % of the memory ceiling
        (`ceiling_gbs`, else the run's stream ceiling); `baseline` adds the speed-up over it (its time / this);
        `after` holds columns measured by the caller, placed after those."""
        row: dict[str, Any] = dict(fields)
        row["median_us"] = time.median * 1e6
        row["spread_pct"] = 100 * time.spread
        ceiling = ceiling_gbs or self.stream_gbs
        if bytes is not None:
            row["GB_s"] = bytes / time.median / 1e9
            if ceiling:
                row["pct_of_ceiling"] = 100 * row["GB_s"] / ceiling
        if baseline is not None:
            row["speedup"] = baseline.median / time.median
        row.update(after or {})
        self.record(row)

    def record(self, row: dict[str, Any]) -> None:
        """Adds a row measured some other way (throughput counted by the caller, not timed here) and prints it."""
        self.rows.append(row)
        print("  " + "  ".join(f"{k}={_fmt(v)}" for k, v in row.items()), flush=True)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def write(self) -> Path:
        """Writes results/<name>[-<part>]-<machine>.md and .csv; returns the markdown path."""
        RESULTS.mkdir(parents=True, exist_ok=True)
        stem = f"{self.name}-{self.part + '-' if self.part else ''}{machine_tag()}"
        columns: list[str] = []
        for row in self.rows:
            columns += [k for k in row if k not in columns]
        with open(RESULTS / f"{stem}.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(self.rows)
        m = machine()
        when = f"{self.started:%Y-%m-%d %H:%M} UTC"
        lines = [f"# {self.title}", "", f"Measured {when} by `benchmarks/bench_{self.name}.py`.", ""]
        lines += ["| machine | |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in m.items()]
        lines += [f"| ceiling: {k} | {v} |" for k, v in self.ceilings.items()]
        lines += ["", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(_fmt(row.get(c, "")) for c in columns) + " |" for row in self.rows]
        if self.notes:
            lines += ["", *self.notes]
        path = RESULTS / f"{stem}.md"
        path.write_text("\n".join(lines) + "\n")
        print(f"wrote {path.relative_to(RESULTS.parent.parent)} and .csv")
        return path


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def _physical_cores() -> int:
    try:
        seen = set()
        cpu = Path("/sys/devices/system/cpu")
        for topo in cpu.glob("cpu[0-9]*/topology"):
            seen.add((topo.joinpath("physical_package_id").read_text(), topo.joinpath("core_id").read_text()))
        return len(seen) or (os.cpu_count() or 1)
    except OSError:
        return os.cpu_count() or 1
