"""What ember is built with and what it will run on (``ember.show_config()``, ``ember.cpu_features()``)."""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

import torch

from ember import _C
from ember._tensor import sync_threads

__all__ = ["config", "cpu_features", "show_config"]

_FEATURE_ORDER = (
    "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16",
    "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",
)  # fmt: skip


def cpu_features() -> dict[str, Any]:
    """The processor's identity and the instruction-set features ember detected (CPUID and XCR0).

    Returns:
        ``{"vendor": str, "brand": str, "avx2": bool, ..., "amx_int8": bool, "amx_permitted": bool}``: a feature is
        True only when the CPU has it and the OS saves its registers; ``amx_permitted`` says Linux granted this
        process the AMX tile state.
    """
    return dict(_C.cpu_features())


def config() -> dict[str, Any]:
    """Everything :func:`show_config` prints, as a dictionary."""
    sync_threads()
    return {
        "ember": {**_C.build_info(), "extension": _C.__file__},
        "torch": {
            "version": torch.__version__,
            "num_threads": torch.get_num_threads(),
            "num_interop_threads": torch.get_num_interop_threads(),
        },
        "onednn": _C.onednn_info(),
        "tbb": {"version": _C.tbb_version()},
        "cpu": cpu_features(),
        "isa": {"active": _C.active_isa(), "detected": _C.detected_isa(), "max": _C.max_isa()},
        "threads": {
            "ember": _C.num_threads(),
            "backend": _C.threading_backend(),
            "cpus_allowed": len(_C.process_cpus()),
        },
    }


def show_config(file: TextIO | None = None) -> None:
    """Prints ember's build, the versions of torch, oneDNN and oneTBB, the CPU, ISA levels and thread counts."""
    c = config()
    e, t, d, cpu, isa, th = c["ember"], c["torch"], c["onednn"], c["cpu"], c["isa"], c["threads"]
    features = " ".join(name for name in _FEATURE_ORDER if cpu.get(name)) or "(none beyond SSE)"
    cap = "none" if isa["max"] == "amx" else isa["max"]
    openmp = "built" if e["openmp"] else "not built"
    env_cap = os.environ.get("EMBER_MAX_ISA", "")
    lines = [
        f"ember {e['version']} ({e['build_type']}, {e['compiler']}, OpenMP backend {openmp})",
        f"  extension: {e['extension']}",
        f"  ISA: {isa['active']} (detected {isa['detected']}, cap {cap}; EMBER_MAX_ISA={env_cap!r})",
        f"  threads: {th['ember']} on {th['backend']} (follows torch.get_num_threads(); "
        f"{th['cpus_allowed']} CPUs allowed)",
        f"torch {t['version']}: {t['num_threads']} intra-op threads, {t['num_interop_threads']} inter-op threads",
        f"oneDNN {d['version']} (commit {d['commit']}, CPU runtime {d['cpu_runtime']}), ISA {d['cpu_isa']}",
        f"oneTBB {c['tbb']['version']}",
        f"CPU: {cpu['brand'] or 'unknown'} ({cpu['vendor']})",
        f"  features: {features}{', AMX permitted' if cpu['amx_permitted'] else ''}",
    ]  # fmt: skip
    print("\n".join(lines), file=file or sys.stdout)
