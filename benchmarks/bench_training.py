"""Training steps (forward + backward + AdamW step) of ResNet-50 and a BERT-base-shaped encoder: time and memory.

Four ways to train the same model (benchmarks/models.py) with AdamW:

- ``torch fp32``: fp32 weights, torch's best AdamW on this torch (``fused=True`` where torch has a CPU fused
  kernel, torch >= 2.4; ``foreach`` before);
- ``torch autocast-bf16``: the same, with forward and loss under ``torch.autocast("cpu", dtype=torch.bfloat16)``:
  stock PyTorch's way to train in bf16 (fp32 master weights, cast to bf16 in every forward);
- ``ember fp32``: ``ember.optimize(model, optimizer=opt)``: only the optimizer becomes ember's fused AdamW;
- ``ember bf16``: ``ember.optimize(model, optimizer=opt, dtype=torch.bfloat16)``: split-BF16 master weights (the
  bf16 top half is the parameter; no fp32 copy exists), bf16 gradients, fused AdamW, channels-last convolutions,
  and dropout (``nn.Dropout``, MultiheadAttention's attention dropout) on ember's kernel;
- ``ember bf16, torch dropout`` (models with dropout only): the same with ``replace_dropout=False``, to show what
  the dropout kernel is worth on its own.

Time: the steps are timed round-robin (harness.time_interleaved), one step per sample, so all see the same
machine; `speedup` is over torch autocast-bf16, the goal's baseline.

Memory, each case in a fresh child process:
- bytes per parameter held between steps: the storages of parameters, gradients and optimizer state (ember's
  master-weight bottom halves included), each storage counted once, over the model's parameter count;
- RSS once training runs (after the first step created the optimizer state), and the peak RSS during the next
  step: the kernel's high-water mark is reset (/proc/self/clear_refs) before it. The children run with
  MALLOC_MMAP_THRESHOLD_=131072 so that freed tensors go back to the OS at once and RSS counts live memory only,
  not glibc's cache. RSS figures are relative to the child's RSS before it built the model (torch imported).

    python benchmarks/bench_training.py [--models resnet50 bert-base] [--batch-resnet50 32] [--batch-bert 16]
                                        [--seq 128] [--rounds 6]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ember
import harness
import models
from bench_optim import torch_has_cpu_fused

CASES = ("torch fp32", "torch autocast-bf16", "ember fp32", "ember bf16")
TORCH_DROPOUT_CASE = "ember bf16, torch dropout"
BASELINE = "torch autocast-bf16"


@dataclass
class Workload:
    model: Callable[[], nn.Module]
    inputs: Callable[[int, int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]  # (batch, seq, gen)
    has_dropout: bool = False


WORKLOADS = {
    "resnet50": Workload(
        models.ResNet50,
        lambda batch, _, gen: (torch.randn(batch, 3, 224, 224, generator=gen), torch.randint(0, 1000, (batch,))),
    ),
    "bert-base": Workload(
        models.BertShapedEncoder,
        lambda batch, seq, gen: (
            torch.randint(0, 30522, (batch, seq), generator=gen),
            torch.randint(0, 2, (batch,), generator=gen),
        ),
        has_dropout=True,
    ),
}


def torch_adamw(params: Any) -> tuple[torch.optim.Optimizer, str]:
    """torch's fastest CPU AdamW on the running torch, and its name."""
    impl = "fused" if torch_has_cpu_fused("adam") else "foreach"
    return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, **{impl: True}), impl


def make_case(case: str, name: str, batch: int, seq: int) -> tuple[Callable[[], None], nn.Module, Any]:
    """The step function of ``case`` on a fresh model (the same initial weights and batch for every case)."""
    workload = WORKLOADS[name]
    torch.manual_seed(0)
    model = workload.model().train()
    if case.startswith("torch"):
        optimizer, _ = torch_adamw(model.parameters())
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
        dtype = torch.bfloat16 if case.startswith("ember bf16") else None
        replace_dropout = False if case == TORCH_DROPOUT_CASE else None
        model, optimizer = ember.optimize(
            model, optimizer=optimizer, dtype=dtype, inplace=True, replace_dropout=replace_dropout
        )
    inputs, target = workload.inputs(batch, seq, torch.Generator().manual_seed(1))
    autocast = case == "torch autocast-bf16"

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext():
            loss = nn.functional.cross_entropy(model(inputs).float(), target)
        loss.backward()
        optimizer.step()

    return step, model, optimizer


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of the storages training keeps between steps, each counted once: parameters, their gradients, and
    every tensor the optimizer holds (its state, and ember's master-weight bottom halves)."""
    seen: set[int] = set()

    def size(tensors: Any) -> int:
        total = 0
        for t in tensors:
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        return total

    params = list(model.parameters())
    held = {"weights": size(params), "grads": size(p.grad for p in params if p.grad is not None)}
    held["optimizer_state"] = size(_tensors_in(list(optimizer.state.values())))
    held["optimizer_other"] = size(_tensors_in(vars(optimizer)))
    return held


def _tensors_in(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in [*value.keys(), *value.values()] for t in _tensors_in(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors_in(v)]
    return []


def _proc_status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def child(case: str, name: str, batch: int, seq: int) -> dict[str, Any]:
    """Runs in a fresh process: the memory of one case."""
    before = _proc_status_kib("VmRSS")
    step, model, optimizer = make_case(case, name, batch, seq)
    step()
    step()
    held = held_bytes(model, optimizer)
    steady = _proc_status_kib("VmRSS")
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM, the peak RSS
        peak_field = "VmHWM"
    except OSError:
        peak_field = "VmHWM (since start: clear_refs refused)"
    step()
    peak = _proc_status_kib("VmHWM")
    return {
        "numel": sum(p.numel() for p in model.parameters()),
        "held": held,
        "rss_mib": (steady - before) / 1024,
        "step_peak_mib": (peak - before) / 1024,
        "peak_field": peak_field,
    }


def measure_memory(case: str, name: str, batch: int, seq: int) -> dict[str, Any]:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    command = [sys.executable, __file__, "--child", case, name, str(batch), str(seq)]
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--batch-resnet50", type=int, default=32)
    parser.add_argument("--batch-bert", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128, help="sequence length of the encoder")
    parser.add_argument("--rounds", type=int, default=6, help="timed steps per case")
    parser.add_argument("--child", nargs=4, metavar=("CASE", "MODEL", "BATCH", "SEQ"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        case, name, batch, seq = args.child
        print(json.dumps(child(case, name, int(batch), int(seq))))
        return

    bench = harness.Benchmark("training", "Training step (forward + backward + AdamW step): ember vs torch")
    _, torch_impl = torch_adamw([torch.zeros(1, requires_grad=True)])
    for name in args.models:
        batch = args.batch_resnet50 if name == "resnet50" else args.batch_bert
        seq = args.seq if name == "bert-base" else 0
        cases = CASES + ((TORCH_DROPOUT_CASE,) if WORKLOADS[name].has_dropout else ())
        steps = {case: make_case(case, name, batch, seq)[0] for case in cases}
        timings = bench.interleaved(steps, rounds=args.rounds, min_time=0.0, warmup=1)
        del steps
        for case in cases:
            memory = measure_memory(case, name, batch, seq)
            numel, held = memory["numel"], memory["held"]
            bench.add(
                model=name, batch=batch, seq=seq or "", case=case,
                optimizer=f"torch AdamW ({torch_impl})" if case.startswith("torch") else "ember AdamW (fused)",
                time=timings[case], baseline=timings[BASELINE], samples_per_s=batch / timings[case].median,
                weights_B=held["weights"] / numel, grads_B=held["grads"] / numel,
                state_B=(held["optimizer_state"] + held["optimizer_other"]) / numel,
                held_B_per_param=sum(held.values()) / numel,
                rss_MiB=memory["rss_mib"], step_peak_MiB=memory["step_peak_mib"],
            )  # fmt: skip
    bench.note(
        f"One row per training case; `speedup` is over `{BASELINE}` timed in the same round-robin. `*_B` columns are "
        "bytes per model parameter held between steps (weights, gradients, optimizer state including ember's "
        "master-weight bottom halves); `rss_MiB` is the resident memory a child process added by building and "
        "training the model, `step_peak_MiB` the peak within one step (both relative to the child's RSS with "
        "torch imported; glibc's mmap threshold pinned so freed tensors leave RSS). BatchNorm and LayerNorm "
        "parameters stay fp32 under ember bf16 (ember/_optimize/bf16_modules.py says why)."
    )
    bench.write()


if __name__ == "__main__":
    main()
