"""ember in one page: train a digit classifier in bf16, optimize it for inference, and compare with stock PyTorch.

    ember-run examples/quickstart.py              # as scripts/demo.sh runs it: one tuned instance
    ember-run --ninstances 2 examples/quickstart.py

Trains an MLP on the 8x8 digits that scikit-learn ships, three times from the same initial weights: with stock
PyTorch in fp32 and under its bf16 autocast (torch.optim.AdamW both), and with ember
(``ember.optimize(..., dtype=torch.bfloat16)``: bf16 compute, split-BF16 master weights, fused AdamW). Then
optimizes the ember-trained model for inference and prints the accuracies and a table of step times and inference
speeds beside stock PyTorch's. Every number is measured in this run.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

import torch
from torch import nn

import ember
from ember.launch import report_throughput


def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """scikit-learn's 1797 digits as 64 pixels in [0, 1]; a fixed 80/20 split."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    cut = len(y) * 4 // 5
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def make_model(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, width), nn.GELU(), nn.Dropout(0.1),
        nn.Linear(width, width), nn.GELU(), nn.Dropout(0.1),
        nn.Linear(width, 10),
    )  # fmt: skip


def progress(label: str, epoch: int, epochs: int, loss: float) -> None:
    """One bar, redrawn in place on a terminal; one line per epoch in a log or behind ember-run's prefix."""
    done = round(30 * epoch / epochs)
    bar = f"{label:>6} [{'#' * done}{'.' * (30 - done)}] epoch {epoch}/{epochs}  loss {loss:.4f}"
    if sys.stdout.isatty():
        print("\r" + bar, end="\n" if epoch == epochs else "", flush=True)
    else:
        print(bar, flush=True)


def train(model: nn.Module, optimizer: torch.optim.Optimizer, data, epochs: int, batch: int, label: str,
          autocast: bool = False) -> float:  # fmt: skip
    """Trains in place (under torch's bf16 autocast if asked); returns the median seconds a step took."""
    x, y = data
    order_gen = torch.Generator().manual_seed(1)
    steps = []
    model.train()
    for epoch in range(1, epochs + 1):
        order = torch.randperm(len(y), generator=order_gen)
        losses = []
        for i in range(0, len(y) - batch + 1, batch):
            idx = order[i : i + batch]
            start = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = nn.functional.cross_entropy(model(x[idx]).float(), y[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            steps.append(time.perf_counter() - start)
            losses.append(loss.item())
        progress(label, epoch, epochs, statistics.mean(losses))
        report_throughput(batch / statistics.median(steps[-len(losses) :]), "samples/s")
    return statistics.median(steps)


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    return 100.0 * (model(x).argmax(1) == y).float().mean().item()


@torch.no_grad()
def seconds_per_call(model: nn.Module, x: torch.Tensor, budget: float = 1.0) -> float:
    for _ in range(5):
        model(x)
    samples, spent = [], 0.0
    while spent < budget or len(samples) < 20:
        start = time.perf_counter()
        model(x)
        samples.append(time.perf_counter() - start)
        spent += samples[-1]
    return statistics.median(samples)


def where_am_i() -> str:
    cpus = os.environ.get("EMBER_INSTANCE_CPUS")
    preload = os.path.basename(os.environ.get("LD_PRELOAD", "").split(":")[0]) or "glibc malloc"
    if cpus is None:
        return f"not under ember-run: {torch.get_num_threads()} threads, {preload}"
    return f"ember-run instance on CPUs {cpus}: {torch.get_num_threads()} threads, {preload}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()

    print(f"ember {ember.__version__}, torch {torch.__version__}, {ember.isa.active_isa()} kernels; {where_am_i()}")
    train_x, train_y, test_x, test_y = digits()
    torch.manual_seed(0)
    initial = make_model(args.width)

    stock = copy.deepcopy(initial)
    stock_step = train(stock, torch.optim.AdamW(stock.parameters(), lr=1e-3), (train_x, train_y), args.epochs,
                       args.batch, "torch")  # fmt: skip

    autocast = copy.deepcopy(initial)
    autocast_step = train(autocast, torch.optim.AdamW(autocast.parameters(), lr=1e-3), (train_x, train_y),
                          args.epochs, args.batch, "torch bf16", autocast=True)  # fmt: skip

    model = copy.deepcopy(initial)
    model, optimizer = ember.optimize(model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                                      dtype=torch.bfloat16)  # fmt: skip
    ember_step = train(model, optimizer, (train_x, train_y), args.epochs, args.batch, "ember")

    # Inference: the trained model, prepared for serving. Its state_dict is still a plain PyTorch one.
    served = ember.optimize(model.eval(), dtype=torch.bfloat16)
    stock.eval()
    autocast.eval()

    def stock_bf16(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return autocast(x)

    rows = [(f"train step, batch {args.batch}", stock_step, autocast_step, ember_step)]
    for batch in (1, 256):
        x = test_x[:batch]
        rows.append((f"inference, batch {batch}", seconds_per_call(stock, x), seconds_per_call(stock_bf16, x),
                     seconds_per_call(served, x)))  # fmt: skip

    print()
    print(f"test accuracy: torch fp32 {accuracy(stock, test_x, test_y):.1f}%, torch bf16 autocast "
          f"{accuracy(stock_bf16, test_x, test_y):.1f}%, "
          f"ember bf16 {accuracy(served, test_x, test_y):.1f}%")  # fmt: skip
    print()
    print(f"| {'':<22} | {'torch fp32':>10} | {'torch bf16 autocast':>19} | {'ember bf16':>10} | "
          f"{'vs fp32':>7} | {'vs autocast':>11} |")  # fmt: skip
    print(f"|{'-' * 24}|{'-' * 12}|{'-' * 21}|{'-' * 12}|{'-' * 9}|{'-' * 13}|")
    for name, fp32, bf16, ours in rows:
        print(f"| {name:<22} | {fp32 * 1e3:7.3f} ms | {bf16 * 1e3:16.3f} ms | {ours * 1e3:7.3f} ms | "
              f"{fp32 / ours:6.2f}x | {bf16 / ours:10.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
