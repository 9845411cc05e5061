"""Prints, as one JSON line, the instance's CPUs, those of the main thread, of each DataLoader worker, and of a
process forked from a thread pinned to two of the instance's CPUs (when it has three or more)."""

import json
import os
import threading

import torch
from forked_affinity import fork_and_report_affinity  # beside this script
from torch.utils.data import DataLoader, Dataset

import ember


class WorkerAffinity(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(sorted(os.sched_getaffinity(0)))


def forked_from_pinned_thread(cpus: list[int]) -> list[int]:
    """A child forked by a thread ember.runtime.pin put on `cpus` keeps them."""
    seen: list[int] = []

    def fork_and_report() -> None:
        with ember.runtime.pin(ember.runtime.CPUPool(core_ids=cpus)):
            seen.extend(fork_and_report_affinity())

    thread = threading.Thread(target=fork_and_report)
    thread.start()
    thread.join()
    return seen


if __name__ == "__main__":
    torch.mm(torch.ones(64, 64), torch.ones(64, 64))  # the OpenMP team exists before the workers fork
    loader = DataLoader(WorkerAffinity(), batch_size=1, num_workers=2, multiprocessing_context="fork")
    workers = sorted({tuple(batch[0].tolist()) for batch in loader})
    instance = sorted(ember.launch.topology.parse_cpu_list(os.environ["EMBER_INSTANCE_CPUS"]))
    pool = instance[1:3] if len(instance) >= 3 else []  # a pool smaller than the instance keeps its children
    print(json.dumps({"instance": instance, "main": sorted(os.sched_getaffinity(0)),
                      "workers": [list(w) for w in workers], "pinned_pool": pool,
                      "pinned_child": forked_from_pinned_thread(pool) if pool else []}), flush=True)  # fmt: skip
