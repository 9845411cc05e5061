"""torch.distributed launches: which ranks this node runs and the variables torch.distributed reads
(``init_method="env://"``, the default): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
MASTER_PORT.

Like torchrun, ember-run runs on every node of the job; ``--node-rank`` says which one this is. A hostfile (one
host a line, the first is the master) gives the node count and master address, and this node's rank when its name
or address is listed.
"""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass
from pathlib import Path

from ember.launch.plan import LaunchError

__all__ = ["Job", "plan_job", "read_hostfile"]

DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class Job:
    nnodes: int
    nproc_per_node: int
    node_rank: int
    master_addr: str
    master_port: int

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def environment(self, local_rank: int) -> dict[str, str]:
        return {
            "RANK": str(self.node_rank * self.nproc_per_node + local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(self.nproc_per_node),
            "GROUP_RANK": str(self.node_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }


def read_hostfile(path: str) -> list[str]:
    """Host names from a hostfile: one a line, '#' comments, anything after the name (MPI's "slots=4") ignored."""
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise LaunchError(f"--hostfile {path}: {error.strerror}") from error
    hosts = [line.split("#", 1)[0].split()[0] for line in text.splitlines() if line.split("#", 1)[0].strip()]
    if not hosts:
        raise LaunchError(f"--hostfile {path} lists no host")
    return hosts


def _this_host_names() -> set[str]:
    names = {socket.gethostname(), socket.getfqdn(), "localhost", "127.0.0.1"}
    with contextlib.suppress(OSError):
        names.update(str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None))
    return names


def plan_job(
    nproc_per_node: int,
    nnodes: int | None = None,
    node_rank: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    hostfile: str | None = None,
    this_host: set[str] | None = None,
) -> Job:
    """Checks and completes the distributed options.

    Raises:
        LaunchError: for counts below 1, a node rank outside the job, a hostfile that disagrees with --nnodes,
            or a multi-node job without a master address.
    """
    hosts = read_hostfile(hostfile) if hostfile else None
    if hosts is not None:
        if nnodes is not None and nnodes != len(hosts):
            raise LaunchError(f"--nnodes {nnodes} disagrees with --hostfile {hostfile}, which lists {len(hosts)} hosts")
        nnodes = len(hosts)
        master_addr = master_addr or hosts[0]
        if node_rank is None:
            names = this_host if this_host is not None else _this_host_names()
            matches = [i for i, h in enumerate(hosts) if h in names]
            if not matches:
                raise LaunchError(f"this host ({socket.gethostname()}) is not in --hostfile {hostfile}; "
                                  "give --node-rank")  # fmt: skip
            node_rank = matches[0]
    nnodes = nnodes or 1
    node_rank = node_rank or 0
    if nproc_per_node < 1:
        raise LaunchError(f"--nproc-per-node must be at least 1, got {nproc_per_node}")
    if nnodes < 1:
        raise LaunchError(f"--nnodes must be at least 1, got {nnodes}")
    if not 0 <= node_rank < nnodes:
        raise LaunchError(f"--node-rank {node_rank} is outside [0, {nnodes})")
    if master_addr is None:
        if nnodes > 1:
            raise LaunchError("a job of several nodes needs --master-addr (or a --hostfile)")
        master_addr = "127.0.0.1"
    port = master_port if master_port is not None else DEFAULT_MASTER_PORT
    if not 0 < port < 65536:
        raise LaunchError(f"--master-port must be in [1, 65535], got {port}")
    return Job(nnodes, nproc_per_node, node_rank, master_addr, port)
