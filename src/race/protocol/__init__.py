"""The study protocol, between the grid and the report: reading a study (its tables split
into pilot and validation runs, its recorded validations, its recommendation) and the
validation stage that runs the recommendation and its rivals at the target budget.

    errors.py     ReportError
    study.py      Study: a study read once (directory, its store opened once, or tables): its tables,
                  pilot vs validation runs, its grid (GridSpec, racing ladder), rung decisions,
                  validation.json; the recommendation for a target budget
    validate.py   validate_study: run the recommendation and rivals at the target budget
                  (through race.grid), and measure the realised regret
    racing.py     run_race: a racing study's rungs (protocol: race), each decided from the store
    target.py     validate_race: a racing study's target run, the pick's pilot continued to T;
                  run_validation: whichever of the two validations the study calls for
    imports.py    import_study (race import): runs trained elsewhere become a study, through
                  import_rows.py (a CSV / JSONL of evaluations), import_trl.py (a TRL output
                  directory) and import_charge.py (their logged tokens charged by RACE's accounting)

``race.report`` renders what this package reads; it never launches a run.
"""

from .errors import ImportRefused
from .imports import ImportResult, import_study
from .study import (
    VALIDATION_FILE,
    ReportError,
    Study,
    default_target_budget,
    load_study,
    read_validations,

    reward_model_cards,
    write_validation,
)
from .validate import ValidationOutcome, choose_allocations, validate_study, validation_grids
from .racing import RaceResult, run_race
from .target import run_validation, validate_race

__all__ = ["VALIDATION_FILE", "ImportRefused", "ImportResult", "RaceResult", "ReportError", "Study",
           "ValidationOutcome", "choose_allocations",
           "run_race", "run_validation", "validate_race",
           "default_target_budget", "import_study", "load_study", "read_validations",

           "reward_model_cards", "validate_study", "validation_grids", "write_validation"]
