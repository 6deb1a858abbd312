"""The run file's ``task:`` block: the built-in arithmetic task, or question/answer data.

``arith`` is the built-in chained-arithmetic task. ``jsonl``, ``parquet`` and ``dataset``
read question/answer problems from local data with Hugging Face ``datasets`` (nothing is
downloaded): a ``.jsonl``/``.json``/``.parquet`` file, a directory of such files, or a
directory written by ``Dataset.save_to_disk``/``DatasetDict.save_to_disk``. ``jsonl`` and
``parquet`` name the format of files whose suffix does not; ``dataset`` infers it.

Data::

    task:
      name: dataset
      train_path: data/gsm8k/train.jsonl     # or path: one file split 80/10/10 by hash
      test_path: data/gsm8k/test.jsonl       # evaluation uses this file's problems
      columns: {question: problem, answer: solution}   # MATH's column names
      prompt_template: "Question: {question}\\nAnswer:"
      chat_template: true                    # the tokenizer's chat template (user turn)
      system_prompt: "Reason step by step."

``prompt_template`` is a Python format string over ``{question}`` and the dataset's other
columns (never the answer); with ``chat_template: true`` it renders the user message
(default ``{question}``) and the tokenizer's chat template renders the prompt, generation
prompt included. The prompt the policy reads -- template and chat markup included -- is
what every engine tokenizes, truncates to ``max_prompt_length`` and charges.
"""

from __future__ import annotations

import string
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

#: Task kinds that read question/answer data.
DATA_TASKS = ("jsonl", "parquet", "dataset")
#: The problem fields a ``columns`` mapping may rename.
COLUMN_ROLES = ("question", "answer")
#: Task settings added after run ids were first issued, with the value that leaves a run's
#: id unchanged (race.spec.run.RunConfig.run_id drops them at these values).
TASK_ID_NEUTRAL: dict[str, Any] = {"train_path": None, "test_path": None, "hard_path": None, "columns": {},
                                   "prompt_template": None, "chat_template": False, "system_prompt": None}


def template_fields(template: str) -> list[str]:
    """The ``{field}`` names of a format string, in order; ``ValueError`` for a malformed
    template or a field that is not a plain name (``{question.__class__}``, ``{0}``)."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ValueError(f"prompt_template {template!r} is not a valid format string ({e}); write fields as "
                         "{question} and literal braces as {{ and }}") from None
    fields: list[str] = []
    for _, name, spec, _ in parsed:
        if name is None:
            continue
        if not name.isidentifier():
            raise ValueError(f"prompt_template field {{{name}}} is not a plain column name: write {{question}} or "
                             "{column} (no positions, attributes or indexes)")
        if spec and "{" in spec:
            raise ValueError(f"prompt_template field {{{name}:{spec}}}: nested fields are not allowed")
        fields.append(name)
    return fields


class TaskSettings(BaseModel):
    """The training/evaluation task (module docstring)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    name: Literal["arith", "jsonl", "parquet", "dataset"] = "arith"
    path: str | None = Field(None, description="one data file or directory, split 80/10/10 by hash")
    train_path: str | None = Field(None, description="training data (with test_path: the whole of it trains)")
    test_path: str | None = Field(None, description="evaluation data: the greedy and pass@k targets read it")
    hard_path: str | None = Field(None, description="data of the 'hard' target (with test_path; else no hard target)")
    columns: dict[str, str] = Field(default_factory=dict, description="problem field -> dataset column, e.g. "
                                    "{question: problem, answer: solution}")
    prompt_template: str | None = Field(None, description="format string over {question} and other columns; "
                                        "default 'Q:{question}\\nA:' ('{question}' with chat_template)")
    chat_template: bool = Field(False, description="render the prompt with the tokenizer's chat template")
    system_prompt: str | None = Field(None, description="system message (chat_template only)")
    min_ops: int = Field(2, ge=1)
    max_ops: int = Field(4, ge=1)
    max_operand: int = Field(19, ge=1, description="operands 0..max_operand (the warm start trains on 0-19)")
    hard_min_ops: int = Field(5, ge=1)
    hard_max_ops: int = Field(5, ge=1)

    @field_validator("columns")
    @classmethod
    def _columns(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if k not in COLUMN_ROLES]
        if bad:
            raise ValueError(f"task.columns keys {bad}: map the problem fields {list(COLUMN_ROLES)} to your dataset's "
                             "columns, e.g. {question: problem, answer: solution}")
        if any(not c for c in v.values()):
            raise ValueError("task.columns: a column name is empty")
        return v

    @field_validator("prompt_template")
    @classmethod
    def _template(cls, v: str | None) -> str | None:
        if v is None:
            return v
        fields = template_fields(v)
        if "question" not in fields:
            raise ValueError(f"prompt_template {v!r} has no {{question}} field: the prompt must show the question")
        if "answer" in fields:
            raise ValueError(f"prompt_template {v!r} shows {{answer}}: the prompt must not contain the answer")
        return v

    @model_validator(mode="after")
    def _check(self) -> "TaskSettings":
        if self.max_ops < self.min_ops:
            raise ValueError(f"task.max_ops ({self.max_ops}) < task.min_ops ({self.min_ops}): raise max_ops")
        if self.hard_max_ops < self.hard_min_ops:
            raise ValueError("task.hard_max_ops < task.hard_min_ops")
        data_fields = [k for k in ("train_path", "test_path", "hard_path", "columns", "prompt_template",
                                   "chat_template", "system_prompt") if getattr(self, k) != TASK_ID_NEUTRAL[k]]
        if self.name == "arith":
            if data_fields:
                raise ValueError(f"task.{data_fields[0]} applies to question/answer data: set task.name to one of "
                                 f"{list(DATA_TASKS)} (the built-in arith task writes its own prompts)")
            return self
        if self.path and self.train_path:
            raise ValueError("give task.path (one file, split by hash) or task.train_path (with task.test_path), "
                             "not both")
        if not (self.path or self.train_path):
            raise ValueError(f"task.name={self.name!r} needs task.path or task.train_path (a local file or "
                             "directory with question/answer columns)")
        if self.hard_path and not self.test_path:
            raise ValueError("task.hard_path needs task.test_path (without it the hard target is a hash slice of "
                             "the training file)")
        if self.system_prompt is not None and not self.chat_template:
            raise ValueError("task.system_prompt needs task.chat_template: true (a plain prompt_template has no "
                             "system turn: write the instruction into the template instead)")
        return self

    @property
    def train_source(self) -> str | None:
        """The training data's path (``train_path``, else ``path``)."""
        return self.train_path or self.path

    def data_paths(self) -> dict[str, str]:
        """Setting name -> path of every data location this task reads."""
        return {k: getattr(self, k) for k in ("path", "train_path", "test_path", "hard_path") if getattr(self, k)}


__all__ = ["COLUMN_ROLES", "DATA_TASKS", "TASK_ID_NEUTRAL", "TaskSettings", "template_fields"]
