"""RACE analysis: pure functions over the runs / evals / train tables.

numpy, pandas and scipy only (no torch, transformers or matplotlib). Every function is
deterministic: randomness comes from an explicit ``rng`` (a seed or a numpy Generator).

Pipeline (see docs/design.md section 5): learning curves -> frontiers -> isoFLOP profiles ->
saturating fits -> bootstrap uncertainty -> regimes and rank stability -> recommendation
and validation; plus diagnostics and a scaling-fit sanity check on Chinchilla.
"""

from .bootstrap import BootstrapResult, Difference, as_rng, bootstrap_cells, difference, win_probabilities
from .curves import best_reached, equal_flops_levels, final_scores, learning_curves, score_at
from .diagnostics import overoptimisation, random_control, waste_table
from .feedback import divergence_point, divergence_table, feedback_comparisons
from .fits import (
    HoldoutResult,
    SaturatingFit,
    SaturatingFitCI,
    bootstrap_saturating,
    fit_curves,
    fit_saturating,
    holdout_check,
    saturating_curve,
)
from .frontier import allocation_scores, frontier, frontier_envelope
from .isoflop import IsoFLOPFit, fit_isoflop, isoflop_table, optimal_size_trend
from .families import FAMILIES, binomial_deviance, fit_family, select_and_forecast
from .gate import learning_gate
from .joint import Replicates, StudyMatrix, draw_replicates, study_matrix
from .recommend import NO_LEARNING, ConfidenceRules, Label, Recommendation, recommend
from .validation import ValidationResult, realised_regret
from .regimes import AXES, axes_between, pairwise_decision_accuracy, rank_stability, regime_changes, regimes
from .scaling import ChinchillaFit, bootstrap_chinchilla, fit_chinchilla
from .tables import (
    ALLOCATION_COLUMNS,
    EVALS_COLUMNS,
    EVALS_OPTIONAL,
    RUNS_COLUMNS,
    RUNS_CORE,
    RUNS_OPTIONAL,
    TRAIN_COLUMNS,
    SchemaError,
    allocation_key,
    allocation_of,
    allocation_table,
    extra_allocation_columns,
    per_problem_array,
    prepare_runs,
    require_columns,
    reward_system,
    validate_evals,
    validate_runs,
    validate_train,
)

__all__ = [
    "ALLOCATION_COLUMNS", "AXES", "EVALS_COLUMNS", "EVALS_OPTIONAL", "RUNS_COLUMNS", "RUNS_CORE", "RUNS_OPTIONAL",
    "TRAIN_COLUMNS", "BootstrapResult", "ChinchillaFit", "Difference", "HoldoutResult", "IsoFLOPFit",
    "Recommendation", "SaturatingFit", "SaturatingFitCI", "SchemaError", "ValidationResult",
    "allocation_key", "allocation_of", "allocation_scores", "allocation_table", "extra_allocation_columns", "as_rng", "axes_between", "best_reached",
    "bootstrap_cells", "bootstrap_chinchilla", "bootstrap_saturating", "difference", "final_scores",
    "fit_chinchilla", "fit_curves", "fit_isoflop", "fit_saturating", "frontier", "frontier_envelope",
    "holdout_check", "isoflop_table", "learning_curves", "optimal_size_trend", "overoptimisation",
    "pairwise_decision_accuracy", "per_problem_array", "prepare_runs", "random_control", "rank_stability",
    "realised_regret", "recommend", "regime_changes", "regimes", "require_columns", "reward_system",
    "saturating_curve", "score_at", "validate_evals", "validate_runs", "validate_train", "waste_table",
    "win_probabilities", "FAMILIES", "NO_LEARNING", "Label", "ConfidenceRules", "Replicates", "StudyMatrix",
    "binomial_deviance", "draw_replicates", "equal_flops_levels", "fit_family", "learning_gate",
    "select_and_forecast", "study_matrix", "divergence_point", "divergence_table", "feedback_comparisons",
]
