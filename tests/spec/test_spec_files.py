"""The ground floor: each concept parsed once (run, grid, reward spec, flops query, YAML)."""

from __future__ import annotations

import math

import pytest

from race.spec import ConfigError, GridSpecError, RunConfig, grid_spec_from_dict, load_run_config, parse_reward
from race.spec.errors import load_yaml_mapping
from race.spec.flops import FlopsQuery, flops_query
from race.spec.run import run_config_from_dict


@pytest.mark.parametrize("budget", [math.inf, -math.inf, math.nan, 0.0, -5.0])
def test_run_config_refuses_non_finite_or_non_positive_budgets(budget):
    with pytest.raises(ConfigError, match="budget_flops"):
        run_config_from_dict({"budget_flops": budget})


def test_the_budget_travels_as_a_float(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("model: tiny-s\nbudget_flops: 1.0e+12\n")
    cfg = load_run_config(f, values={"budget_flops": 1e16})
    assert cfg.budget_flops == 1e16 and type(cfg.budget_flops) is float
    assert load_run_config(f, ["lora.r=8"], values={"lora.lora_alpha": 8.0}).lora.lora_alpha == 8.0


def test_one_yaml_loader_turns_syntax_errors_into_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [tiny-s\n  x: :\n")
    with pytest.raises(ConfigError) as e:
        load_yaml_mapping(bad)
    assert "not valid YAML (line 2" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(GridSpecError, match="not valid YAML"):
        from race.spec import load_grid_spec

        load_grid_spec(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_yaml_mapping(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- a\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_yaml_mapping(tmp_path / "list.yaml")


@pytest.mark.parametrize("text, kind, weights", [
    ("rule", "rule", {"outcome": 1.0}),
    ("rule:partial", "rule", {"partial": 1.0}),
    ("rule:outcome+format", "rule", {"outcome": 0.5, "format": 0.5}),
    ("random", "random", {}),
    ("math", "math", {}),
    ("prm:prm-s:min+outcome", "prm", {"rm": 0.5, "outcome": 0.5}),
    ("orm:orm-xs", "orm", {"rm": 1.0}),
])
def test_one_reward_grammar(text, kind, weights):
    spec = parse_reward(text)
    assert spec.kind == kind and spec.weights == weights and spec.text == text


@pytest.mark.parametrize("bad, match", [("rule:bogus", "rule terms"), ("math:x", "takes no argument"),
                                        ("orm", "needs a model"), ("xyz", "kind must be"), ("", "empty")])
def test_the_reward_grammar_says_what_to_write(bad, match):
    with pytest.raises(ValueError, match=match):
        parse_reward(bad)


def test_math_works_wherever_a_reward_is_named():
    """The run file, the registry, planning and the grid's dry run read one grammar."""
    from race.grid import predict_cell
    from race.rewards import make_reward
    from race.rewards.systems import reward_system

    cfg = RunConfig(budget_flops=1e12, reward="math", model="tiny-xs")
    assert make_reward(cfg.reward).name == "math"
    assert reward_system("math").kind == "rule" and reward_system("random").kind == "random"
    assert predict_cell(cfg)["feedback"] == 0.0
    assert reward_system("prm:prm-xs:min+outcome").name == "prm-xs"


def test_the_flops_query_reads_the_run_files_trl_names():
    ours = FlopsQuery(model="tiny-s", group=4, prompt_len=32, completion_len=48, iterations=2, lora_rank=8,
                      budget=1e12)
    trl = flops_query({"model": "tiny-s", "num_generations": 4, "max_prompt_length": 32,
                       "max_completion_length": 48, "num_iterations": 2, "lora": {"r": 8}, "budget_flops": 1e12})
    assert trl == ours
    with pytest.raises(ConfigError, match="--group must be >= 2"):
        flops_query({"model": "tiny-s", "group": 1}, "flags")
    with pytest.raises(ConfigError, match="steps or budget"):
        flops_query({"model": "tiny-s", "steps": 3, "budget": 1e12})


def test_a_grid_spec_expands_once(monkeypatch):
    import race.spec.grid as G
    from race.grid import plan_grid

    calls = []
    real = G.expand_cells
    monkeypatch.setattr(G, "expand_cells", lambda spec: calls.append(1) or real(spec))
    spec = grid_spec_from_dict({"study": "s", "budgets": [1e12, 1e13], "axes": {"model": ["tiny-xs", "tiny-s"]}})
    plan = plan_grid(spec.with_runner(workers=1))
    assert len(plan.cells) == 4 and len(spec.cells()) == 4 and calls == [1]
