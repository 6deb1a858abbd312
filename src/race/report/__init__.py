"""RACE report: figures (matplotlib) and a self-contained HTML / Markdown / JSON report of
a pilot study, plus the validation stage that runs the recommendation at the target budget.

    study.py             load a study (directory or tables); pilot vs validation runs
    figures.py           one function per figure: analysis outputs in, PNG bytes out
    sections_study.py    summary, report card, frontier, compute split, isoFLOP, curves, seconds
    sections_decision.py regimes, recommendation, validation, diagnostics
    render.py            HTML (inline CSS, base64 figures) and Markdown
    build.py             build_report
    validate.py          validate_study: run the recommendation and rivals at the target budget

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
from .study import VALIDATION_FILE, ReportError, StudyData, default_target_budget, load_study, read_validations
from .validate import ValidationOutcome, validate_study

__all__ = [
    "DEFAULT_TARGETS", "ReportPaths", "build_report", "ReportError", "StudyData", "load_study", "read_validations",
    "default_target_budget", "VALIDATION_FILE", "ValidationOutcome", "validate_study", "compute_split_figure",
    "flops_seconds_figure", "frontier_figure", "isoflop_figure", "learning_curves_figure", "predictions_figure",
    "regime_heatmap", "to_png",
]
