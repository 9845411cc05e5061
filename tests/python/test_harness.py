"""The benchmark harness itself (benchmarks/harness.py): timing, ceilings and the files it writes; and the
picture plot_models.py draws from those files."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

HARNESS = Path(__file__).resolve().parents[2] / "benchmarks" / "harness.py"


def _load(path: Path, name: str):
    """A script of benchmarks/ as a module (the folder is no package)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def harness():
    return _load(HARNESS, "ember_bench_harness")


def test_time_call_orders_its_statistics(harness) -> None:
    calls = []
    t = harness.time_call(lambda: calls.append(1), min_time=0.01, warmup=2)
    assert t.samples >= 5 and len(calls) > t.samples
    assert 0 < t.p10 <= t.median <= t.p90
    assert t.spread >= 0


def test_ceilings_are_positive(harness) -> None:
    assert harness.stream_ceiling(elements=1 << 16, min_time=0.01) > 0
    peaks = harness.gemm_ceiling(n=64, min_time=0.01)
    assert set(peaks) == {"float32", "bfloat16"} and all(v > 0 for v in peaks.values())


def test_machine_description_names_cpu_and_versions(harness) -> None:
    m = harness.machine()
    assert m["torch"] == torch.__version__ and m["onednn"].startswith("3.")
    tag = harness.machine_tag()
    assert tag.startswith(("intel-", "amd-", "cpu-")) and "torch" in tag


def test_write_produces_markdown_and_csv(harness, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(harness, "RESULTS", tmp_path)
    bench = harness.Benchmark("selftest", "harness self-test")
    bench.stream_gbs = 10.0
    t = harness.Timing(median=1e-3, p10=0.9e-3, p90=1.2e-3, samples=9)
    bench.add(case="a", time=t, bytes=5e6, baseline=harness.Timing(2e-3, 2e-3, 2e-3, 1))
    bench.note("a note")
    md = bench.write()
    text = md.read_text()
    assert "| a | 1000 |" in text and "a note" in text
    row = md.with_suffix(".csv").read_text().splitlines()[1].split(",")
    assert row[0] == "a" and float(row[3]) == pytest.approx(5.0) and float(row[4]) == pytest.approx(50.0)
    assert float(row[5]) == pytest.approx(2.0)


def test_interleaved_timing_covers_every_case(harness) -> None:
    counts = {"a": 0, "b": 0}

    def make(name: str):
        def fn() -> None:
            counts[name] += 1

        return fn

    timings = harness.time_interleaved({"a": make("a"), "b": make("b")}, rounds=4, min_time=0.02, warmup=1)
    assert set(timings) == {"a", "b"}
    for name, t in timings.items():
        assert t.samples >= 4, "at least one sample per round"
        assert counts[name] > t.samples and 0 < t.p10 <= t.median <= t.p90


def test_a_part_is_written_beside_the_whole_run(harness, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(harness, "RESULTS", tmp_path)
    bench = harness.Benchmark("selftest", "harness self-test", part="fp32-a")
    bench.add(case="a", time=harness.Timing(1e-3, 1e-3, 1e-3, 1))
    assert bench.write().name == f"selftest-fp32-a-{harness.machine_tag()}.md"


def test_plot_models_draws_the_latest_run_of_each_row(tmp_path, monkeypatch) -> None:
    pytest.importorskip("matplotlib")
    plot_models = _load(HARNESS.parent / "plot_models.py", "ember_bench_plot_models")
    monkeypatch.setattr(plot_models, "RESULTS", tmp_path)
    header = "model,dtype,batch,impl,max_rel_err,median_us,spread_pct,speedup,setup_s\n"
    runs = {  # part: (when it was measured, bert's graph speedup at batch 1)
        "models-a-m1": ("2026-11-27 02:30", "1.5"),
        "models-b-m1": ("2026-11-27 05:00", "2.5"),
        "models-c-m1": ("2026-11-26 09:00", "0.5"),
    }
    for stem, (when, speedup) in runs.items():
        (tmp_path / f"{stem}.md").write_text(f"# t\n\nMeasured {when} UTC by `benchmarks/bench_models.py`.\n")
        (tmp_path / f"{stem}.csv").write_text(
            header + "bert,bfloat16,1,torch eager,0,10,1,1,\n" + f"bert,bfloat16,1,ember graph,0,5,1,{speedup},2\n"
        )
    (tmp_path / "models-other-m2.csv").write_text(header + "bert,bfloat16,1,ember graph,0,5,1,9.0,2\n")
    rows = plot_models.latest_rows("m1")
    assert rows[("bert", "bfloat16", "1", "ember graph")]["speedup"] == "2.5"
    out = tmp_path / "plot.png"
    plot_models.plot("m1", "bfloat16", out)
    assert out.read_bytes().startswith(b"\x89PNG")
    with pytest.raises(SystemExit, match="no float32 results"):
        plot_models.plot("m1", "float32", out)
