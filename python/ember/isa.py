"""Which instruction-set level ember's kernels run at, and how to cap it.

Levels, lowest first: ``ref`` (portable C++), ``avx2``, ``avx512``, ``avx512_bf16``, ``amx``. Kernels run at the
highest level the CPU supports, the OS enables and the cap allows. The cap starts from the environment variable
``EMBER_MAX_ISA`` and lets tests exercise every path on one machine, like oneDNN's ``ONEDNN_MAX_CPU_ISA``.
``EMBER_VERBOSE=1`` (or :func:`set_verbose`) logs each kernel call and the implementation it ran to stderr.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ember import _C

__all__ = [
    "LEVELS",
    "active_isa",
    "capped",
    "detected_isa",
    "max_isa",
    "set_max_isa",
    "set_verbose",
    "supported_levels",
    "verbose",
]

LEVELS: tuple[str, ...] = tuple(_C.isa_levels())


def detected_isa() -> str:
    """The highest level this machine supports, ignoring the cap."""
    return _C.detected_isa()


def active_isa() -> str:
    """The level kernels run at now: the lower of the detected level and the cap."""
    return _C.active_isa()


def max_isa() -> str:
    """The current cap (``"amx"`` when uncapped)."""
    return _C.max_isa()


def set_max_isa(isa: str) -> None:
    """Caps the level kernels may use (``"native"`` removes the cap). Raises ValueError for an unknown name."""
    if not isinstance(isa, str):
        raise TypeError(f"set_max_isa: isa must be a str, got {type(isa).__name__}")
    _C.set_max_isa(isa)


def supported_levels() -> list[str]:
    """Every level this machine can run, lowest first: the paths a test should cover."""
    top = LEVELS.index(detected_isa())
    return list(LEVELS[: top + 1])


@contextlib.contextmanager
def capped(isa: str) -> Iterator[None]:
    """Runs the body with the ISA cap set to ``isa``, restoring the previous cap afterwards."""
    previous = max_isa()
    set_max_isa(isa)
    try:
        yield
    finally:
        _C.set_max_isa(previous)


def verbose() -> bool:
    """Whether kernel calls are logged to stderr."""
    return _C.verbose()


def set_verbose(on: bool) -> None:
    """Turns the per-call log (``ember_verbose,<op>,<isa>,<detail>`` on stderr) on or off."""
    _C.set_verbose(bool(on))
