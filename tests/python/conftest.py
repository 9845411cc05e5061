"""Shared fixtures: every kernel test runs once per ISA level this machine supports."""

from __future__ import annotations

import pytest
import torch

import ember


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [
        f"torch {torch.__version__}, ember {ember.__version__} from {ember._C.__file__}",
        f"ember ISA levels here: {ember.isa.supported_levels()}",
    ]


@pytest.fixture(params=ember.isa.supported_levels())
def isa_level(request: pytest.FixtureRequest):
    """Caps ember's ISA at each supported level in turn (the reference path included)."""
    with ember.isa.capped(request.param):
        yield request.param


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)
