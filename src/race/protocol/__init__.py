"""The study protocol, between the grid and the report: reading a study (its tables split
into pilot and validation runs, its recorded validations, its recommendation) and the
validation stage that runs the recommendation and its rivals at the target budget.

    study.py      load a study (directory or tables); pilot vs validation runs; validation.json;
                  the recommendation for a target budget
    validate.py   validate_study: run the recommendation and rivals at the target budget
                  (through race.grid), and measure the realised regret

``race.report`` renders what this package reads; it never launches a run.
"""

from .study import (
    VALIDATION_FILE,
    ReportError,
    StudyData,
    default_target_budget,
    grid_primary_target,
    load_study,
    read_validations,
    recommend_for,
    reward_model_cards,
    write_validation,
)
from .validate import ValidationOutcome, choose_allocations, validate_study, validation_grids

__all__ = ["VALIDATION_FILE", "ReportError", "StudyData", "ValidationOutcome", "choose_allocations",
           "default_target_budget", "grid_primary_target", "load_study", "read_validations", "recommend_for",
           "reward_model_cards", "validate_study", "validation_grids", "write_validation"]
