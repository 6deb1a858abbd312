"""``race plan --update-generations`` and ``race flops --update-generations``: a row per
(G, m) with its update share p (and p_policy), p falling as the update trains on fewer of
each prompt's rollouts, below 0.5 for a rule reward on tiny-m; the FLOPs are the
accounting's (``StepPlan(update_generations=m)``)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from race.cli.app import app

TINY = ["plan", "--budget", "1e13", "--models", "tiny-m", "--groups", "8", "--prompts", "4", "--prompt-len", "24",
        "--completion-len", "48", "--lora-rank", "16"]


def _invoke(*args: str) -> tuple[int, str]:
    res = CliRunner(env={"COLUMNS": "200"}).invoke(app, list(args))
    return res.exit_code, res.output


def test_a_row_per_m_with_p_falling_below_one_half_for_a_rule_reward():
    from race.accounting import LoRA, StepPlan, update_share
    from race.models.refs import resolve_shape
    from race.rewards.systems import reward_system

    code, out = _invoke(*TINY, "--rewards", "rule:partial,prm:prm-xs:min+partial", "--update-generations",
                        "all,6,4,2", "--json")
    assert code == 0, out
    rows = json.loads(out)
    by = {(r["reward"], r["num_update_generations"]): r for r in rows}
    assert set(by) == {(rw, m) for rw in ("rule", "prm:prm-xs") for m in (8, 6, 4, 2)}
    for rw in ("rule", "prm:prm-xs"):
        ps = [by[(rw, m)]["p"] for m in (8, 6, 4, 2)]
        assert ps == sorted(ps, reverse=True)
        assert all(by[(rw, m)]["sequences"] == 32 for m in (8, 6, 4, 2))  # the rollouts generated stay
    assert by[("rule", 2)]["p"] <= 0.5 < by[("rule", 8)]["p"]
    assert by[("prm:prm-xs", 2)]["p"] < by[("prm:prm-xs", 2)]["p_policy"] == by[("rule", 2)]["p_policy"]
    step = StepPlan(resolve_shape("tiny-m"), 8, lora=LoRA(16), update_generations=2,
                    reward=reward_system("rule:partial")).uniform(4, 24, 48)
    assert by[("rule", 2)]["step_flops"] == step.total and by[("rule", 2)]["p"] == update_share(step)["p"]
    code, out = _invoke(*TINY, "--rewards", "rule:partial", "--update-generations", "8,4,2")
    assert code == 0, out
    assert "m = rollouts per prompt the update trains on" in out and "p_pol" in out
    line = next(ln for ln in out.splitlines() if "tiny-m" in ln and "│ 2 │" in ln)
    assert f"{by[('rule', 2)]['p']:.2f}" in line


def test_m_larger_than_a_group_is_left_out_and_bad_values_are_refused():
    code, out = _invoke(*TINY, "--groups", "4,8", "--rewards", "rule", "--update-generations", "6", "--json")
    assert code == 0, out
    assert [(r["num_generations"], r["num_update_generations"]) for r in json.loads(out)] == [(8, 6)]
    for bad, needle in (("1", "2 or more rollouts"), ("x", "comma-separated whole numbers or 'all'"),
                        ("9", "every value exceeds the largest group 8")):
        code, out = _invoke(*TINY, "--update-generations", bad)
        assert code != 0 and needle in out, out


def test_flops_reports_the_update_share_of_m_of_g():
    args = ["flops", "--model", "tiny-m", "--group", "8", "--prompts", "4", "--lora-rank", "16", "--json"]
    code, out = _invoke(*args, "--update-generations", "2")
    assert code == 0, out
    two = json.loads(out)
    code, out = _invoke(*args)
    full = json.loads(out)
    assert two["num_update_generations"] == 2 and full["num_update_generations"] == 8
    assert two["step"]["rollout"] == full["step"]["rollout"] and two["step"]["update"] * 4 == full["step"]["update"]
    assert two["p"] < full["p"]
    code, out = _invoke(*args, "--update-generations", "9")
    assert code != 0 and "update_generations=9 > group=8" in out
