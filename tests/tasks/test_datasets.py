"""Real datasets: column mapping, prompt templates, chat templates, separate train/test
data, save_to_disk and directories of files, and the errors that say what to change."""

from __future__ import annotations

import json

import pytest

from race.spec.errors import ConfigError
from race.spec.run import run_config_from_dict
from race.spec.task import TaskSettings
from race.tasks import FileTask, load_problems_file
from race.tasks.prompts import PromptFormat

CHAT = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}")
MATH_ROWS = [{"problem": f"What is {i} + {i}?", "solution": f"It is $\\boxed{{{2 * i}}}$.", "level": f"L{i % 3}"}
             for i in range(40)]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def chat_tok(char_tokenizer):
    import copy

    tok = copy.deepcopy(char_tokenizer)
    tok.chat_template = CHAT
    return tok


def test_column_mapping_and_template_with_other_columns(tmp_path):
    path = _jsonl(tmp_path / "math.jsonl", MATH_ROWS)
    probs = load_problems_file(path, columns={"question": "problem", "answer": "solution"},
                               prompt=PromptFormat("[{level}] Question: {question}\nAnswer:"))
    assert probs[3].prompt == "[L0] Question: What is 3 + 3?\nAnswer:"
    assert probs[3].answer == "6" and probs[3].question == "What is 3 + 3?"


def test_missing_column_names_the_columns_found(tmp_path):
    path = _jsonl(tmp_path / "math.jsonl", MATH_ROWS)
    with pytest.raises(ValueError, match=r"no column 'question' for the question \(columns found: \['problem', "
                                         r"'solution', 'level'\]\); set task.columns"):
        load_problems_file(path)
    with pytest.raises(ValueError, match=r"no column 'sol' for the answer .*task.columns.answer is 'sol'"):
        load_problems_file(path, columns={"question": "problem", "answer": "sol"})


def test_template_fields_are_checked(tmp_path):
    path = _jsonl(tmp_path / "math.jsonl", MATH_ROWS)
    cols = {"question": "problem", "answer": "solution"}
    with pytest.raises(ValueError, match=r"field \{topic\} is not a column .*\['problem', 'level'\]"):
        load_problems_file(path, columns=cols, prompt=PromptFormat("{topic}: {question}"))
    with pytest.raises(ValueError, match=r"answer column 'solution' is never shown"):
        load_problems_file(path, columns=cols, prompt=PromptFormat("{question} {solution}"))
    with pytest.raises(ValueError, match="not a plain column name"):
        PromptFormat("{question.__class__}")
    with pytest.raises(ConfigError, match=r"prompt_template .* has no \{question\} field"):
        run_config_from_dict({"budget_flops": 1e9, "task": {"name": "jsonl", "path": "x.jsonl",
                                                            "prompt_template": "Solve:"}})
    with pytest.raises(ConfigError, match=r"must not contain the answer"):
        run_config_from_dict({"budget_flops": 1e9, "task": {"name": "jsonl", "path": "x.jsonl",
                                                            "prompt_template": "{question} {answer}"}})
    with pytest.raises(ConfigError, match="not a valid format string"):
        run_config_from_dict({"budget_flops": 1e9, "task": {"name": "jsonl", "path": "x.jsonl",
                                                            "prompt_template": "{question"}})


def test_chat_template_renders_system_and_user_turns(tmp_path, chat_tok):
    path = _jsonl(tmp_path / "math.jsonl", MATH_ROWS)
    fmt = PromptFormat("Solve: {question}", chat=True, system_prompt="Be brief.", tokenizer=chat_tok)
    p = load_problems_file(path, columns={"question": "problem", "answer": "solution"}, prompt=fmt)[1]
    assert p.prompt == "<system>Be brief.\n<user>Solve: What is 1 + 1?\n<assistant>"
    plain = PromptFormat(chat=True, tokenizer=chat_tok).render("hi")
    assert plain == "<user>hi\n<assistant>"


def test_chat_template_on_a_tokenizer_without_one_is_refused(char_tokenizer):
    assert not getattr(char_tokenizer, "chat_template", None)
    with pytest.raises(ValueError, match="has no chat template .* set task.chat_template: false"):
        PromptFormat(chat=True, tokenizer=char_tokenizer)
    with pytest.raises(ValueError, match="needs the policy's tokenizer"):
        PromptFormat(chat=True)


def test_settings_are_validated_with_the_change_named():
    def task(**t):
        return run_config_from_dict({"budget_flops": 1e9, "task": t})

    with pytest.raises(ConfigError, match="task.prompt_template applies to question/answer data"):
        task(prompt_template="{question}")
    with pytest.raises(ConfigError, match="not both"):
        task(name="jsonl", path="a.jsonl", train_path="b.jsonl")
    with pytest.raises(ConfigError, match="needs task.path or task.train_path"):
        task(name="dataset", test_path="t.jsonl")
    with pytest.raises(ConfigError, match="system_prompt needs task.chat_template: true"):
        task(name="jsonl", path="a.jsonl", system_prompt="hi")
    with pytest.raises(ConfigError, match="hard_path needs task.test_path"):
        task(name="jsonl", path="a.jsonl", hard_path="h.jsonl")
    with pytest.raises(ConfigError, match=r"task.columns keys \['prompt'\]"):
        task(name="jsonl", path="a.jsonl", columns={"prompt": "x"})
    ok = task(name="dataset", train_path="a.jsonl", test_path="b.jsonl", columns={"question": "problem"})
    assert ok.task.train_source == "a.jsonl" and ok.task.data_paths() == {"train_path": "a.jsonl",
                                                                            "test_path": "b.jsonl"}


def test_separate_test_data_is_the_test_split(tmp_path):
    train = _jsonl(tmp_path / "train.jsonl", MATH_ROWS[:30])
    test = _jsonl(tmp_path / "test.jsonl", MATH_ROWS[28:])  # two problems in both: kept out of training
    s = TaskSettings(name="dataset", train_path=str(train), test_path=str(test),
                     columns={"question": "problem", "answer": "solution"})
    task = FileTask.from_settings(s)
    assert task.split_sizes() == {"train": 28, "test": 12, "hard": 0}
    test_q = {r["problem"] for r in MATH_ROWS[28:]}
    assert {p.question for p in task.problems("test", 100)} == test_q
    assert not {p.question for p in task.problems("train", 100)} & test_q
    assert task.problems("hard", 10) == []  # no hard data: the hard target is skipped
    with_hard = FileTask(train, test_path=test, hard_path=test, columns={"question": "problem", "answer": "solution"})
    assert len(with_hard.problems("hard", 5)) == 5


def test_save_to_disk_and_directories_of_files(tmp_path):
    from datasets import Dataset, DatasetDict

    cols = {"question": "problem", "answer": "solution"}
    ds = Dataset.from_list(MATH_ROWS)
    ds.save_to_disk(str(tmp_path / "one"))
    assert len(load_problems_file(tmp_path / "one", columns=cols)) == 40
    DatasetDict(train=ds.select(range(30)), test=ds.select(range(30, 40))).save_to_disk(str(tmp_path / "dd"))
    task = FileTask(tmp_path / "dd", test_path=tmp_path / "dd", columns=cols)
    assert task.split_sizes() == {"train": 30, "test": 10, "hard": 0}
    DatasetDict(a=ds, b=ds).save_to_disk(str(tmp_path / "ab"))
    with pytest.raises(ValueError, match=r"splits \['a', 'b'\] and none is named 'train'"):
        load_problems_file(tmp_path / "ab", columns=cols)
    (tmp_path / "pq" / "data").mkdir(parents=True)
    ds.select(range(20)).to_parquet(str(tmp_path / "pq" / "data" / "train-0.parquet"))
    ds.select(range(20, 40)).to_parquet(str(tmp_path / "pq" / "data" / "train-1.parquet"))
    assert [p.question for p in load_problems_file(tmp_path / "pq", columns=cols)] == [r["problem"] for r in MATH_ROWS]
    _jsonl(tmp_path / "pq" / "extra.jsonl", MATH_ROWS[:1])
    with pytest.raises(ValueError, match="both parquet and json"):
        load_problems_file(tmp_path / "pq", columns=cols)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no .parquet, .jsonl or .json files"):
        load_problems_file(tmp_path / "empty")
