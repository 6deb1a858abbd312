"""A real-dataset run end to end: a JSONL train file and a JSONL test file with MATH's column
names, a prompt template and the tokenizer's chat template, through ``race train`` and
through a small grid. The ledger's prefill charges the templated prompts; evaluation reads
the test file."""

from __future__ import annotations

from race.accounting import PolicyCost
import json
import shutil
from pathlib import Path

import pytest
import yaml

CHAT = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}")
TEMPLATE = "Solve: {question}"
SYSTEM = "Answer with a number."


def _rows(lo: int, hi: int) -> list[dict]:
    return [{"problem": f"What is {i} + {i % 7}?", "solution": f"So $\\boxed{{{i + i % 7}}}$."} for i in range(lo, hi)]


@pytest.fixture(scope="module")
def chat_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny test model with a character tokenizer that has a chat template."""
    from race.models.tokenizer import build_char_tokenizer

    path = tmp_path_factory.mktemp("tiny-chat")
    for f in Path(tiny_model_dir).iterdir():
        if f.name.endswith((".json", ".safetensors")) and "token" not in f.name:
            shutil.copy(f, path / f.name)
    tok = build_char_tokenizer()
    tok.chat_template = CHAT
    tok.save_pretrained(path)
    return path


@pytest.fixture
def data(tmp_path):
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in _rows(0, 60)))
    test.write_text("".join(json.dumps(r) + "\n" for r in _rows(100, 106)))
    return train, test


def _task(train: Path, test: Path) -> dict:
    return {"name": "dataset", "train_path": str(train), "test_path": str(test),
            "columns": {"question": "problem", "answer": "solution"}, "prompt_template": TEMPLATE,
            "chat_template": True, "system_prompt": SYSTEM}


def _run_settings(model_dir: Path, train: Path, test: Path) -> dict:
    return {"model": str(model_dir), "budget_flops": 3e9, "max_steps": 2, "prompts_per_step": 3,
            "num_generations": 2, "max_prompt_length": 96, "max_completion_length": 8, "reward": "random",
            "learning_rate": 1e-3, "seed": 1, "torch_threads": 1, "task": _task(train, test),
            "eval": {"n_problems": 50, "n_pass_problems": 2, "pass_k": 2, "num_points": 1}}


def _templated(question: str) -> str:
    return f"<system>{SYSTEM}\n<user>Solve: {question}\n<assistant>"


def _expected_prefill(cfg, step: int) -> tuple[int, int, int]:
    """(prefill tokens, prompt width, width without any template) of ``step``'s prompts
    rendered through the chat template (the character tokenizer: one token per character)."""
    from race.engines.common import make_task

    problems = make_task(cfg).problems("train", cfg.prompts_per_step, seed=cfg.seed * 1_000_003 + step)
    lens = [len(_templated(p.question)) for p in problems]
    assert all(p.prompt == _templated(p.question) for p in problems)
    return sum(lens), max(lens), max(len(p.question) for p in problems)


def _check_prefill(cfg, rows: list[dict], step: int) -> None:
    """The ledger's prefill tokens and FLOPs are those of the templated prompts."""
    from race.accounting import LoRA, rollout_components
    from race.models import load_policy, model_shape

    tokens, width, bare_width = _expected_prefill(cfg, step)
    pre = next(r for r in rows if r["step"] == step and r["phase"] == "rollout" and r["component"] == "prefill")
    assert pre["tokens"] == tokens
    shape = model_shape(load_policy(cfg.model, device="cpu", dtype="float32")[0])
    lora = LoRA(cfg.lora.r, tuple(cfg.lora.target_modules))
    n = cfg.prompts_per_step * cfg.num_generations

    # a merged-LoRA rollout (race.engines.sampling) runs the base weights: no LoRA term
    merged = any(r["step"] == step and r["phase"] == "rollout" and r["component"] == "merge" for r in rows)

    def prefill(width: int) -> int:
        return rollout_components(PolicyCost(shape, None if merged else lora, cfg.conventions),
                                  [width] * cfg.prompts_per_step, [1] * n, share_prompt=True)["rollout/prefill"]

    assert pre["flops"] == prefill(width) > prefill(bare_width)


def test_race_train_on_a_chat_templated_dataset(chat_model_dir, data, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from race.cli.app import app
    from race.engines import evaluation
    from race.spec.run import run_config_from_dict

    train, test = data
    settings = _run_settings(chat_model_dir, train, test)
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump(settings))
    seen: list[str] = []
    real_init = evaluation.Evaluator.__init__

    def spy(self, task, *a, **k):
        real_init(self, task, *a, **k)
        seen.extend(p.question for p in self.test + self.passk + self.hard)

    monkeypatch.setattr(evaluation.Evaluator, "__init__", spy)
    res = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["train", str(run_file), "--output-dir", str(tmp_path / "r"),
                                                         "--quiet"])
    assert res.exit_code == 0, res.output
    out = json.loads((tmp_path / "r" / "run.json").read_text())
    assert out["status"] == "complete" and out["steps"] == 2
    test_questions = {r["problem"] for r in _rows(100, 106)}
    assert seen and set(seen) <= test_questions  # evaluation reads the test file only
    evals = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    greedy = [r for r in evals if r.get("kind") == "eval" and r["target"] == "greedy"]
    assert greedy and all(r["n"] == 6 for r in greedy)  # the whole test file (n_problems 50 > 6 rows)
    assert not any(r.get("target") == "hard" for r in evals)  # no hard data: no hard target
    rows = [json.loads(x) for x in (tmp_path / "r" / "ledger.jsonl").read_text().splitlines()]
    cfg = run_config_from_dict(settings)
    for step in (1, 2):
        _check_prefill(cfg, rows, step)


def test_race_train_says_when_the_tokenizer_has_no_chat_template(tiny_model_dir, data, tmp_path):
    from typer.testing import CliRunner

    from race.cli.app import app

    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump(_run_settings(tiny_model_dir, *data)))
    res = CliRunner(env={"COLUMNS": "400"}).invoke(app, ["train", str(run_file), "--output-dir", str(tmp_path / "r"),
                                                         "--quiet"])
    assert res.exit_code == 2 and "has no chat template" in res.output and "Traceback" not in res.output


def test_grid_on_a_chat_templated_dataset(chat_model_dir, data, tmp_path):
    from race.grid import Store, run_grid
    from race.spec.run import run_config_from_dict

    train, test = data
    base = _run_settings(chat_model_dir, train, test)
    for k in ("budget_flops", "num_generations", "eval", "seed"):
        base.pop(k)
    spec = {"study": "chat-data", "budgets": [3e9], "require_budget_span": False, "base": base,
            "axes": {"num_generations": [2, 3]}, "seeds": [0], "min_steps": 0,
            "eval": {"n_problems": 4, "n_pass_problems": 0, "num_points": 1, "targets": ["greedy"]},
            "runner": {"kind": "local", "workers": 1, "threads_per_worker": 1}, "max_retries": 0}
    result = run_grid(spec, tmp_path / "study")
    assert result.complete == 2 and not result.failed
    with Store(tmp_path / "study", create=False) as s:
        runs = s.runs()
        ledger = s.rows("ledger")
    assert len(runs) == 2
    for run in runs:
        cfg = run_config_from_dict(json.loads(run["spec_json"]))
        assert cfg.task.chat_template and cfg.task.test_path == str(test)
        rows = [r for r in ledger if r["run_id"] == run["run_id"]]
        tokens, _, _ = _expected_prefill(cfg, 1)
        pre = next(r for r in rows if r["step"] == 1 and r["phase"] == "rollout" and r["component"] == "prefill")
        assert pre["tokens"] == tokens


def test_templated_prompts_cut_to_max_prompt_length_warn_and_charge_what_runs(chat_model_dir, data, tmp_path):
    from race.engines import run_engine
    from race.spec.run import run_config_from_dict

    settings = {**_run_settings(chat_model_dir, *data), "max_prompt_length": 20, "max_steps": 1}
    with pytest.warns(UserWarning, match="cut to their last max_prompt_length=20: the template's start"):
        run_engine(run_config_from_dict(settings), tmp_path / "r")
    rows = [json.loads(x) for x in (tmp_path / "r" / "ledger.jsonl").read_text().splitlines()]
    pre = next(r for r in rows if r["step"] == 1 and r["phase"] == "rollout" and r["component"] == "prefill")
    assert pre["tokens"] == 20 * settings["prompts_per_step"]
