"""What every reward system reads of a problem and a completion: the completion made safe
for any tokenizer, the prompt and question texts, and the rule-based verification
(``race.tasks``: parsed, never evaluated)."""

from __future__ import annotations

from typing import Any


#: Characters of a completion a reward model reads at most (before tokenising).
MAX_TEXT_CHARS = 16_384


def sanitize(text: Any, max_chars: int = MAX_TEXT_CHARS) -> str:
    """A str any tokenizer accepts: non-strings -> "", cut to ``max_chars``, lone
    surrogates and other unencodable code points -> ``?``."""
    if not isinstance(text, str):
        return ""
    text = text[:max_chars]
    return text.encode("utf-8", "replace").decode("utf-8")


def prompt_of(problem: Any) -> str:
    """The prompt text of a problem (built-in or question/answer)."""
    return str(getattr(problem, "prompt", "") or "")


def question_of(problem: Any) -> str:
    """The question of a question/answer problem, else its prompt."""
    return str(getattr(problem, "question", None) or getattr(problem, "prompt", "") or "")


def verify_terms(problem: Any, completion: Any) -> tuple[float, float, float]:
    """(outcome 0/1, partial credit, format 0/1) of one completion: the rule terms' scorers
    (``race.rewards.rule_terms``)."""
    from race.rewards.rule_terms import answer_format, outcome, partial

    return outcome(problem, completion), partial(problem, completion), answer_format(problem, completion)
