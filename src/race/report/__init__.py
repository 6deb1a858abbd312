"""RACE report: figures (matplotlib) and a self-contained HTML / Markdown / JSON report of
a pilot study. The report only renders: the study it reads and the validation stage that
runs the recommendation at the target budget are ``race.protocol``'s.

    doc.py               the report as data (sections, blocks) and its shared context
    figures.py           one function per figure: analysis outputs in, PNG bytes out
    sections_study.py    summary, report card, frontier, compute split, isoFLOP, curves, seconds
    sections_decision.py regimes, recommendation, validation, how to read the report
    sections_diagnostics.py  wasted rollouts, truncation, over-optimisation, the random-reward control
    render.py            HTML (inline CSS, base64 figures) and Markdown
    build.py             build_report

matplotlib is imported only when a figure is drawn.
"""

from .build import DEFAULT_TARGETS, ReportPaths, build_report
from .figures import (
    compute_split_figure,
    flops_seconds_figure,
    frontier_figure,
    isoflop_figure,
    learning_curves_figure,
    predictions_figure,
    regime_heatmap,
    to_png,
)

__all__ = [
    "DEFAULT_TARGETS", "ReportPaths", "build_report", "compute_split_figure",
    "flops_seconds_figure", "frontier_figure", "isoflop_figure", "learning_curves_figure", "predictions_figure",
    "regime_heatmap", "to_png",
]
