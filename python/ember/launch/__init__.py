"""ember-run, the launcher: runs a program as tuned instances (cores, NUMA nodes, OpenMP, allocator) or as the
processes of a torch.distributed job. ``ember-run --help`` lists the options; docs/guides/launcher.md explains them.

For ``--autotune``, a program reports its throughput with :func:`report_throughput`.
"""

from ember.launch.protocol import autotuning, report_throughput

__all__ = ["autotuning", "report_throughput"]
