"""One-operation arithmetic as question/answer data (GSM8K form, ``#### answer``): the
task a small pretrained instruct model partly solves (docs/real-model.md).

Every problem ``a + b`` and ``a - b`` with operands ``1..max_operand`` (subtraction only
with ``a >= b``, so answers are never negative) is written once, shuffled by a seeded
stream, and dealt into a test file (the first ``n_test``) and a train file (the rest):
disjoint by construction. Rows read ``{"question": "What is 17 - 5?", "answer": "#### 12"}``
so ``task: {name: dataset}`` reads them like GSM8K. The files under
``configs/data/arith-qa/`` are :func:`write_qa_files`'s output with its defaults (a test
regenerates and compares them byte for byte).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path


def qa_rows(max_operand: int = 30) -> list[dict[str, str]]:
    """Every problem, in a fixed order: ``a + b`` for all pairs, ``a - b`` for ``a >= b``."""
    if max_operand < 1:
        raise ValueError(f"max_operand={max_operand}: use 1 or more")
    rows = []
    for a in range(1, max_operand + 1):
        for b in range(1, max_operand + 1):
            rows.append({"question": f"What is {a} + {b}?", "answer": f"#### {a + b}"})
            if a >= b:
                rows.append({"question": f"What is {a} - {b}?", "answer": f"#### {a - b}"})
    return rows


def write_qa_files(out_dir: str | os.PathLike[str], *, max_operand: int = 30, n_test: int = 500,
                   seed: int = 0) -> dict[str, Path]:
    """Write ``train.jsonl`` and ``test.jsonl`` into ``out_dir``; returns their paths."""
    rows = qa_rows(max_operand)
    if not 0 < n_test < len(rows):
        raise ValueError(f"n_test={n_test}: there are {len(rows)} problems, keep some for training")
    random.Random(seed).shuffle(rows)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"test": out / "test.jsonl", "train": out / "train.jsonl"}
    for name, part in (("test", rows[:n_test]), ("train", rows[n_test:])):
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in part))
    return paths


__all__ = ["qa_rows", "write_qa_files"]
