"""Your reward function by import path (``reward: py:MODULE:FUNCTION``, ``race.rewards.python``):
the grammar, the import and its errors, TRL's call (keyword arguments in, one float per
completion out) and what a wrong return says, the charge (a rule's 0 FLOPs, or the scoring
model the function declares, priced by the reward-kind table) in both engines, and the
packaged example (configs/tiny-pyreward.yaml). The functions live in
``tests/data/pyrewards/race_test_rewards.py``, a module the tests put on ``sys.path``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from race.spec.errors import ConfigError
from race.spec.reward import parse_reward, reward_columns
from race.spec.run import load_run_config, run_config_from_dict

ROOT = Path(__file__).resolve().parents[2]
FUNCS = ROOT / "tests" / "data" / "pyrewards"


@pytest.fixture
def on_path(monkeypatch):
    """The test module importable, as a user's module on PYTHONPATH is; a fresh import."""
    monkeypatch.syspath_prepend(str(FUNCS))
    from race.rewards import python

    monkeypatch.setattr(python, "_FUNCTIONS", {})
    for name in ("race_test_rewards", "race_test_broken", "rewards_example"):
        sys.modules.pop(name, None)
    import race_test_rewards

    race_test_rewards.CALLS.clear()
    return race_test_rewards


def _problems(n: int = 3):
    from race.tasks import ArithTask

    return ArithTask(seed=0).problems("train", n, seed=11)


def test_the_grammar_takes_an_import_path_and_says_what_to_write():
    spec = parse_reward("py:mypkg.rewards:correctness")
    assert (spec.kind, spec.target, str(spec), spec.learned) == ("py", "mypkg.rewards:correctness",
                                                                  "py:mypkg.rewards:correctness", False)
    assert reward_columns(spec) == {"reward_system": "py", "reward_rule": None, "reward_model": None,
                                    "reward_learned": False, "reward_random": False}
    for bad in ("py:", "py:mypkg", "py:mypkg.rewards:", "py:os.system('ls'):x", "py:a b:c", "py:a:b:c"):
        with pytest.raises(ValueError, match="write py:package.module:function"):
            parse_reward(bad)
    with pytest.raises(ConfigError, match="py:MODULE:FUNCTION"):
        run_config_from_dict({"budget_flops": 1e9, "reward": "python:x:y"})
    # parsing imports nothing: a run file naming a module absent here still loads (the workers import it)
    assert str(run_config_from_dict({"budget_flops": 1e9, "reward": "py:not_here_at_all:f"}).reward) == \
        "py:not_here_at_all:f"


def test_import_errors_say_what_to_do(on_path):
    from race.rewards import make_reward
    from race.rewards.python import RewardFunctionError

    cases = [
        ("py:race_test_absent_module:f", ["no module named 'race_test_absent_module'", "PYTHONPATH", "ray start"]),
        ("py:race_test_broken:f", ["it imports 'race_test_not_installed_anywhere'", "not installed"]),
        ("py:race_test_rewards:missing", ["has no 'missing'", "final_answer", "one_short"]),
        ("py:race_test_rewards:NOT_A_FUNCTION", ["is a int, not a function"]),
        ("py:race_test_rewards:judged", ["race_reward_model = 'judge:tiny-xs'", "orm:NAME or prm:NAME"]),
    ]
    for spec, needles in cases:
        with pytest.raises(RewardFunctionError) as e:
            make_reward(spec)
        for needle in needles:
            assert needle in str(e.value), (spec, str(e.value))
        assert isinstance(e.value, ValueError)  # a bad reward spec, as the grammar's errors are


def test_wrong_returns_are_refused_with_what_came_back(on_path):
    from race.rewards import make_reward
    from race.rewards.python import RewardFunctionError

    problems = _problems()
    texts = ["1+2=3;#3.", "", "x"]
    cases = {"one_short": "returned 2 rewards for 3 completions", "a_none": "returned None for completion 0",
             "a_string": "returned a str: return a list of floats", "not_finite": "returned nan (float)",
             "positional": "completion_ids"}
    for name, needle in cases.items():
        with pytest.raises(RewardFunctionError, match=needle.replace("(", r"\(").replace(")", r"\)")):
            make_reward(f"py:race_test_rewards:{name}").score(problems, texts)


def test_the_function_gets_trls_keyword_arguments_and_is_charged_as_a_rule(on_path):
    from race.rewards import make_reward
    from race.rewards.rule_terms import outcome

    problems = _problems()
    right = [f"{p.steps[0][0]}+0=0;#{p.answer}." for p in problems]
    reward = make_reward("py:race_test_rewards:final_answer")
    out = reward.score(problems, right)
    assert on_path.CALLS[-1] == {"keys": ["answer", "completions", "id", "n_ops", "prompts", "split", "steps"], "n": 3}
    assert all(r >= 1.0 for r in out.rewards) and out.components == {} and out.flops == 0
    assert out.verified == [outcome(p, c) for p, c in zip(problems, right)]
    assert reward.step_bound(64, 32, 32, problems=problems) == 0
    wrong = reward.score(problems, ["#99999." for _ in problems])
    assert all(0 <= r < 1.0 for r in wrong.rewards)


def test_a_declared_model_is_charged_as_its_kind_at_the_policys_lengths(on_path, char_tokenizer):
    """``race_reward_model = "orm:tiny-xs"``: one forward of tiny-xs with an ORM's head at
    the last token over each prompt + completion (the char tokenizer: one token a
    character), exactly ``reward_model_flops`` of the table's orm row; the planner and the
    step bound price the same model."""
    from race.accounting import counted, reward_model_flops
    from race.rewards import make_reward
    from race.rewards.systems import reward_system

    problems = _problems()
    texts = ["12+3=15;#15.", "1", ""]
    reward = make_reward("py:race_test_rewards:digits_by_model", tokenizer=char_tokenizer, conventions="race")
    out = reward.score(problems, texts)
    system = reward_system("orm:tiny-xs")
    assert reward_system("py:race_test_rewards:digits_by_model") == system == reward.system
    lengths = [len(p.prompt) + len(t) for p, t in zip(problems, texts)]
    assert out.components == reward_model_flops(system, lengths, head_positions="last", conventions="race")
    assert out.tokens == sum(lengths) and out.flops > 0
    assert out.rewards == [7 / 12, 1.0, 0.0]
    bound = reward.step_bound(3, 5, 12, problems=problems)
    longest = max(len(p.prompt) for p in problems)
    assert bound == counted(reward_model_flops(system, [longest + 12] * 3, head_positions="last", conventions="race"))
    assert bound >= out.flops  # every completion here is at most 12 tokens


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["builtin", "trl"])
def test_both_engines_train_on_the_function_and_charge_its_model(on_path, tiny_model_dir, tmp_path, engine):
    from race.engines import run_engine

    def run(name: str) -> tuple[dict, list[dict]]:
        cfg = run_config_from_dict(dict(engine=engine, model=str(tiny_model_dir), budget_flops=1.2e9,
                                        prompts_per_step=4, num_generations=4, max_completion_length=12,
                                        reward=f"py:race_test_rewards:{name}", learning_rate=1e-3, seed=1,
                                        drop_zero_variance_groups=False, torch_threads=1,
                                        eval={"n_problems": 8, "n_hard_problems": 0, "n_pass_problems": 0,
                                              "targets": ["greedy"], "num_points": 1}))
        out = run_engine(cfg, tmp_path / name)
        return out, [json.loads(x) for x in (tmp_path / name / "ledger.jsonl").read_text().splitlines()]

    calls = len(on_path.CALLS)
    rule, rule_ledger = run("final_answer")
    assert rule["status"] == "complete" and rule["steps"] >= 2 and rule["engine"] == engine
    assert len(on_path.CALLS) - calls == rule["steps"]  # one call per step, in this process
    assert all(r["flops"] == 0 for r in rule_ledger if r["phase"] == "reward")
    model, ledger = run("digits_by_model")
    per_step = [sum(r["flops"] for r in ledger if r["phase"] == "reward" and r["step"] == s and r["counted"])
                for s in range(1, model["steps"] + 1)]
    assert model["status"] == "complete" and all(f > 0 for f in per_step)
    assert model["phase_flops"]["reward"] == sum(per_step) and model["total_flops"] <= 1.2e9


def test_the_packaged_example_runs(monkeypatch, tiny_model_dir, tmp_path):
    """configs/tiny-pyreward.yaml with configs/ on the path, as its comment says, on the tiny
    test model and a small budget: the function scores the task's completions."""
    from race.engines import run_engine
    from race.rewards import make_reward

    monkeypatch.syspath_prepend(str(ROOT / "configs"))
    sys.modules.pop("rewards_example", None)
    cfg = load_run_config(ROOT / "configs" / "tiny-pyreward.yaml")
    assert str(cfg.reward) == "py:rewards_example:correct_answer"
    problems = _problems(2)
    out = make_reward(cfg.reward).score(problems, [f"#{problems[0].answer}.", "#-1."])
    assert out.rewards == [1.0, 0.1] and out.flops == 0
    small = cfg.model_copy(update={"model": str(tiny_model_dir), "budget_flops": 6e8, "prompts_per_step": 2,
                                   "num_generations": 2, "max_completion_length": 8,
                                   "eval": cfg.eval.model_copy(update={"n_problems": 4, "n_hard_problems": 0,
                                                                       "n_pass_problems": 0, "targets": ["greedy"],
                                                                       "num_points": 1})})
    run = run_engine(run_config_from_dict(small.model_dump(mode="json")), tmp_path / "example")
    assert run["status"] == "complete" and run["steps"] >= 1 and run["phase_flops"].get("reward", 0) == 0
