"""The graph tests import their shared helpers as ``graphs`` (this folder on sys.path); the fixtures they share."""

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from ember import _C
from ember._optimize.graph import attention_node

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def kernel_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times the fused attention nodes call ember's attention kernel (counted, then run)."""
    calls = [0]

    def scaled_dot_product_attention(*args: Any, **kwargs: Any) -> None:
        calls[0] += 1
        _C.scaled_dot_product_attention(*args, **kwargs)

    monkeypatch.setattr(
        attention_node, "_C", types.SimpleNamespace(scaled_dot_product_attention=scaled_dot_product_attention)
    )
    return calls
