"""Fixtures for the analysis tests; the synthetic-study generator is in analysis_synth.py
(a uniquely named module, so other test folders' conftest files cannot shadow it)."""

import pytest

from analysis_synth import LARGE, MEDIUM, SMALL, make_study


@pytest.fixture
def crossing_study():
    """Budgets 1e14 (small wins by ~0.07) and 1e16 (large wins by ~0.14)."""
    return make_study([SMALL, MEDIUM, LARGE], budgets=[1e14, 1e16], rng=1)
