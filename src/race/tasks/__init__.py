"""Tasks: the built-in chained-arithmetic generator and its parsing verifier, and
GSM8K/MATH-style question/answer data with prompt and chat templates. Standard library at
import time (``datasets`` loads only when data is read)."""

from race.tasks.arith import (
    ANSWER_PREFIX,
    END_MARK,
    FINAL_MARK,
    PROMPT_PREFIX,
    SPLITS,
    STEP_SEP,
    ArithTask,
    Problem,
    make_problem,
    solution_text,
    split_of,
    step_seed,
)
from race.tasks.files import FileTask, TextProblem, extract_final_answer, load_problems_file, verify_final_answer
from race.tasks.prompts import PromptFormat
from race.tasks.verify import MAX_DIGITS, Verification, outcome_reward, partial_credit, verify

__all__ = [
    "ANSWER_PREFIX", "END_MARK", "FINAL_MARK", "MAX_DIGITS", "PROMPT_PREFIX", "SPLITS", "STEP_SEP",
    "ArithTask", "FileTask", "Problem", "TextProblem", "Verification", "extract_final_answer", "load_problems_file",
    "PromptFormat", "make_problem", "outcome_reward", "partial_credit", "solution_text", "split_of", "step_seed",
    "verify", "verify_final_answer",
]
