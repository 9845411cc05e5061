"""fork_and_report_affinity: the CPUs a process forked from the calling thread starts on."""

import json
import os


def fork_and_report_affinity() -> list[int]:
    """Forks; the child writes its CPUs to a pipe and exits at once (the caller may have other threads)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, json.dumps(sorted(os.sched_getaffinity(0))).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        seen = json.loads(f.read())
    os.waitpid(pid, 0)
    return seen
