"""Which CPUs the calling thread is pinned to: the per-thread record ``pin`` keeps and the fork hook
(``child_affinity``) reads, in a module of its own so that neither has to import the other."""

from __future__ import annotations

import threading

_state = threading.local()  # .pools: the CPUs of every pin this thread is in, innermost last


def pinned_pools() -> list[tuple[int, ...]]:
    """The calling thread's stack of pinned CPU sets, innermost last (created empty on first use)."""
    pools: list[tuple[int, ...]] | None = getattr(_state, "pools", None)
    if pools is None:
        pools = _state.pools = []
    return pools


def pinned_cpus() -> tuple[int, ...] | None:
    """The CPUs of the innermost ``pin`` the calling thread is in, or None."""
    pools = pinned_pools()
    return pools[-1] if pools else None
