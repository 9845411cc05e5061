"""The graph tests import their shared helpers as ``graphs`` (this folder on sys.path); the fixtures they share."""

import sys
from pathlib import Path

import pytest

from ember._optimize.graph import attention_node

sys.path.insert(0, str(Path(__file__).parent))
from graphs import count_calls


@pytest.fixture
def kernel_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times the fused attention nodes call ember's attention kernel (test_fuse_norm's own fixture of this
    name counts the row-norm kernel)."""
    return count_calls(monkeypatch, attention_node, "scaled_dot_product_attention")
