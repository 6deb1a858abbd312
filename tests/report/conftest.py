"""Fixtures for the report tests: synthetic studies (report_synth.py) and their reports,
built once per session with few bootstrap replicates (the numbers are checked against
the analysis functions run with the same settings, not against fixed values)."""

from __future__ import annotations

import pytest

import report_synth
from report_synth import N_BOOT, N_BOOT_FIT


@pytest.fixture(scope="session")
def full_tables():
    return report_synth.full_study()


@pytest.fixture(scope="session")
def full_report(tmp_path_factory, full_tables):
    from race.report import build_report

    out = tmp_path_factory.mktemp("full-report")
    paths = build_report(full_tables, out, n_boot=N_BOOT, n_boot_fit=N_BOOT_FIT)
    return paths
