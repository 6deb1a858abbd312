"""GSM8K/MATH-style JSONL and Parquet files: answers extracted, missing fields named."""

from __future__ import annotations

import json

import pytest

from race.tasks import TextProblem, extract_final_answer, load_problems_file, verify_final_answer

ROWS = [
    {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
    {"question": "What is 1000 + 234?", "answer": "Add them.\n#### 1,234"},
    {"question": "Simplify 2/4.", "answer": "We get $\\boxed{\\frac{1}{2}}$."},
    {"question": "What is 6 x 7?", "answer": "42"},
]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_loader_extracts_final_answers(tmp_path):
    probs = load_problems_file(_write_jsonl(tmp_path / "gsm.jsonl", ROWS))
    assert [p.answer for p in probs] == ["7", "1234", "\\frac{1}{2}", "42"]
    assert all(isinstance(p, TextProblem) for p in probs)
    assert probs[0].prompt == "Q:Tom has 3 apples and buys 4 more. How many?\nA:"
    assert probs[0].solution == ROWS[0]["answer"]
    assert len({p.id for p in probs}) == 4
    assert [p.answer for p in load_problems_file(tmp_path / "gsm.jsonl", limit=2)] == ["7", "1234"]
    custom = load_problems_file(tmp_path / "gsm.jsonl", template="Question: {question}\nAnswer:")
    assert custom[3].prompt == "Question: What is 6 x 7?\nAnswer:"


def test_parquet_loader(tmp_path):
    from datasets import Dataset

    path = tmp_path / "math.parquet"
    Dataset.from_list(ROWS).to_parquet(str(path))
    probs = load_problems_file(path)
    assert [p.answer for p in probs] == ["7", "1234", "\\frac{1}{2}", "42"]


def test_missing_field_names_the_row(tmp_path):
    rows = [ROWS[0], ROWS[1], {"question": "no answer here"}, ROWS[3]]
    with pytest.raises(ValueError, match=r"row 2 has no 'answer' field"):
        load_problems_file(_write_jsonl(tmp_path / "bad.jsonl", rows))
    rows = [{"prompt": "x", "answer": "1"}]
    with pytest.raises(ValueError, match=r"no column 'question' for the question \(columns found: \['prompt', 'answer'\]\)"):
        load_problems_file(_write_jsonl(tmp_path / "bad2.jsonl", rows))


def test_bad_paths_and_formats(tmp_path):
    with pytest.raises(FileNotFoundError, match="problem file not found"):
        load_problems_file(tmp_path / "nope.jsonl")
    (tmp_path / "x.csv").write_text("question,answer\n")
    with pytest.raises(ValueError, match="cannot tell the format"):
        load_problems_file(tmp_path / "x.csv")


def test_extract_and_verify_final_answer():
    assert extract_final_answer("blah\n#### 72") == "72"
    assert extract_final_answer("so \\boxed{x^{2}+1}.") == "x^{2}+1"
    p = TextProblem("id", "Q:..\nA:", "1234", "q", "s")
    assert verify_final_answer(p, "The total is 1,234.").correct
    assert verify_final_answer(p, "work...\n#### 1234").correct
    assert verify_final_answer(p, "1+1=2;#1234.").correct
    assert verify_final_answer(p, "\\boxed{1234.0}").correct
    assert not verify_final_answer(p, "#### 1233").correct
    assert not verify_final_answer(p, "no number").correct
    assert not verify_final_answer(p, None).correct
    frac = TextProblem("id", "Q", "\\frac{1}{2}", "q", "s")
    assert verify_final_answer(frac, "\\boxed{\\frac{1}{2}}").correct
    assert not verify_final_answer(frac, "x" * 1_000_000).correct


def test_file_task_has_the_task_interface(tmp_path):
    from race.spec.run import TaskSettings
    from race.tasks import FileTask

    rows = [{"question": f"What is {i} + {i}?", "answer": f"#### {2 * i}"} for i in range(300)]
    path = _write_jsonl(tmp_path / "many.jsonl", rows)
    task = FileTask.from_settings(TaskSettings(name="jsonl", path=str(path)))
    sizes = task.split_sizes()
    assert sum(sizes.values()) == 300 and sizes["train"] > sizes["test"] > 0 and sizes["hard"] > 0
    ids = {s: {p.id for p in task.problems(s, 1000)} for s in ("train", "test", "hard")}
    assert [len(v) for v in ids.values()] == [sizes["train"], sizes["test"], sizes["hard"]]
    assert not ids["train"] & ids["test"] and not ids["train"] & ids["hard"] and not ids["test"] & ids["hard"]
    a, b = task.problems("train", 16, seed=3), task.problems("train", 16, seed=3)
    assert a == b and len(a) == 16 and a != task.problems("train", 16, seed=4)
    assert all(p.split == "train" and p.answer == str(2 * int(p.question.split()[2])) for p in a)
    with pytest.raises(ValueError, match="unknown split"):
        task.problems("valid", 3)
    with pytest.raises(ValueError, match="needs name jsonl, parquet or dataset"):
        FileTask.from_settings(TaskSettings())
    tiny = FileTask(_write_jsonl(tmp_path / "one.jsonl", ROWS[:1]))
    empty = next(s for s, n in tiny.split_sizes().items() if n == 0)
    with pytest.raises(ValueError, match=f"the '{empty}' split is empty"):
        tiny.problems(empty, 1)
