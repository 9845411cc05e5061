"""Text generation on ember's kernels: ``ember.llm.optimize(model)`` for Hugging Face causal LMs, with ember's own
paged key/value cache (``ember.llm.KVCache``). See docs/guides/llm.md."""

from __future__ import annotations

from typing import Any

from ember.llm.api import optimize
from ember.llm.families import FAMILIES

__all__ = ["FAMILIES", "KVCache", "optimize"]


def __getattr__(name: str) -> Any:
    # The cache class derives from transformers.Cache where transformers is installed: made on first use, so that
    # importing ember does not import transformers.
    if name == "KVCache":
        from ember.llm.cache import kv_cache_class

        return kv_cache_class()
    raise AttributeError(f"module 'ember.llm' has no attribute {name!r}")
