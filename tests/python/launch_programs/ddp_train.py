"""Run by the launcher test under ember-run --nproc-per-node 2: a few DDP steps over gloo; each rank saves its
parameters and placement so the test can check that the ranks agree and ran on their own cores."""

import json
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
ddp = torch.nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
data = torch.Generator().manual_seed(100 + rank)  # each rank its own batches: only the all-reduce keeps them equal
for _ in range(5):
    x = torch.randn(8, 10, generator=data)
    loss = (ddp(x) - x.sum(1, keepdim=True)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
torch.save([p.detach() for p in model.parameters()], os.path.join(sys.argv[1], f"rank{rank}.pt"))
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(
        {
            "world": world,
            "local_rank": os.environ["LOCAL_RANK"],
            "affinity": sorted(os.sched_getaffinity(0)),
            "threads": torch.get_num_threads(),
        },
        f,
    )
# Every rank done with gloo before any tears its connections down: a rank destroying its group while the peer's
# gloo threads still talk to it aborted the peer ("terminate called without an active exception") about one run
# in six on the 2-core VM.
dist.barrier()
del ddp
dist.destroy_process_group()
# Leave without interpreter teardown: gloo objects still referenced at finalization can destroy a joinable
# std::thread there and abort the same way (seen once in 30-odd runs after the barrier went in). This test is
# about ember-run's wiring; everything it checks is written above.
sys.stdout.flush()
os._exit(0)
