"""``num_update_generations`` in the engines: the built-in engine generates and scores
``num_generations`` rollouts per prompt and trains on the ``m`` its ``update_selection``
chooses, advantages among those m; its ledger (rollout for all n, the learning passes for
the m kept) equals what FlopCounterMode counts, step by step. In a gang, members that
differ in the setting write their solo runs' ledgers and metrics, and a gang step executes
what their ledgers charge."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from race.spec.run import run_config_from_dict

LOSS_KEYS = ("loss", "kl", "clip_frac")  # sums over differently blocked matmuls in a gang (test_gang_engine)


def _cfg(model_dir: Path, **over):
    d = dict(model=str(model_dir), budget_flops=5e9, prompts_per_step=4, num_generations=6, num_update_generations=3,
             max_completion_length=10, reward="random", learning_rate=1e-2, seed=5, max_steps=3,
             eval={"n_problems": 2, "n_hard_problems": 0, "n_pass_problems": 0, "targets": ["greedy"]},
             lora={"r": 4, "lora_alpha": 8}, torch_threads=1, conventions="torch")
    d.update(over)
    return run_config_from_dict(d)


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _counted(led: list[dict], step: int) -> dict[str, int]:
    return {f"{r['phase']}/{r['component']}": r["flops"] for r in led if r["step"] == step and r["counted"]}


def _run_counted(cfg, out: Path, monkeypatch):
    """Run ``cfg`` with FlopCounterMode around each training step; each step's count and
    what the step's reward stage returned (``Scored``)."""
    from torch.utils.flop_counter import FlopCounterMode

    from race.engines import builtin, run_engine
    from race.engines.builtin import step_parts

    measured: dict[int, int] = {}
    scored: dict[int, object] = {}
    real_step, real_score = builtin.BuiltinEngine._train_step, step_parts.StepStages.score

    def counted(self, step, *a, **k):
        with FlopCounterMode(display=False) as fc:
            charged = real_step(self, step, *a, **k)
        measured[step] = fc.get_total_flops()
        return charged

    def keep(self, problems, ro, step):
        scored[step] = sc = real_score(self, problems, ro, step)
        return sc

    with monkeypatch.context() as m:
        m.setattr(builtin.BuiltinEngine, "_train_step", counted)
        m.setattr(step_parts.StepStages, "score", keep)
        result = run_engine(cfg, out)
    return result, measured, scored


@pytest.mark.parametrize("selection, mu, beta", [("max_variance", 2, 0.05), ("random", 1, 0.0)])
def test_the_ledger_equals_measured_and_trains_on_the_chosen_rows(tiny_model_dir, tmp_path, monkeypatch, selection,
                                                                  mu, beta):
    """G=6, m=3, 4 prompts (random rewards): each step's ledger equals FlopCounterMode's
    count; the rows kept are 3 per prompt, the ones the selection chooses from the step's 24
    rewards (max variance: brute force's best variance), their advantages are GRPO's among
    the 3, the update batch is in groups of 3; the rollout is charged for all 24 (step 1,
    before any update, equals a run training on all 6) and the learning passes for the kept rows only."""
    import itertools
    import statistics

    from race.engines.grpo_math import group_advantages

    cfg = _cfg(tiny_model_dir, update_selection=selection, num_iterations=mu, beta=beta)
    out, measured, scored = _run_counted(cfg, tmp_path / "m3", monkeypatch)
    full, _, _ = _run_counted(cfg.model_copy(update={"num_update_generations": None,
                                                    "update_selection": "max_variance"}),
                              tmp_path / "all", monkeypatch)
    assert out["steps"] == 3 and full["steps"] == 3
    led, led_all = _lines(tmp_path / "m3" / "ledger.jsonl"), _lines(tmp_path / "all" / "ledger.jsonl")
    kept_any = False
    for step, flops in measured.items():
        charged = _counted(led, step)
        assert flops == sum(charged.values()), step
        sc = scored[step]
        r = sc.rewards.tolist()
        assert len(r) == 24
        for g in range(4):
            rows = [i - 6 * g for i in sc.rows.tolist() if 6 * g <= i < 6 * (g + 1)]
            assert len(rows) in (0, 3)  # whole update groups of m, or the group dropped (no signal among its m)
            if selection == "max_variance":
                best = max(statistics.pvariance([r[6 * g + i] for i in c]) for c in itertools.combinations(range(6), 3))
                if rows:
                    assert statistics.pvariance([r[6 * g + i] for i in rows]) == pytest.approx(best, abs=1e-12)
                else:  # dropped only when no 3 of the 6 differ: every reward of the group equal
                    assert best == 0
        if sc.rows.numel():
            kept_any = True
            sub = sc.rewards[sc.rows]
            want, _ = group_advantages(sub, 3, scale=cfg.scale_rewards)
            torch.testing.assert_close(sc.adv[sc.rows], want)
            assert sc.batch.group == 3 and sc.batch.prompt_ids.shape[0] == sc.rows.numel()
            n_learn = charged["update/forward"] // mu
            if beta:
                assert charged["old_logprobs/forward"] == n_learn and charged["reference/forward"] > 0
    assert kept_any
    one, one_all = _counted(led, 1), _counted(led_all, 1)
    assert {k: v for k, v in one.items() if k.startswith("rollout/")} == \
        {k: v for k, v in one_all.items() if k.startswith("rollout/")}
    assert one["update/forward"] < one_all["update/forward"] * mu  # fewer rows in the learning passes
    rows = _lines(tmp_path / "m3" / "metrics.jsonl")
    train = [x for x in rows if x.get("kind") == "train"]
    assert all("update_reward_std" in x for x in train)
    assert not any("update_reward_std" in x for x in _lines(tmp_path / "all" / "metrics.jsonl"))


def _members(model_dir: Path):
    """Members that differ in the knob: max-variance 3 of 6, random 2 of 4 with two
    iterations and a reference pass, and all 4 of 4."""
    base = dict(budget_flops=2e9, max_steps=None, max_completion_length=12, learning_rate=1e-3, checkpoint_every=2,
                conventions="race", eval={"n_problems": 8, "n_hard_problems": 0, "n_pass_problems": 0,
                                          "targets": ["greedy"], "num_points": 2})
    return [_cfg(model_dir, seed=3, **base),
            _cfg(model_dir, seed=4, num_generations=4, num_update_generations=2, update_selection="random",
                 num_iterations=2, beta=0.05, **{**base, "budget_flops": 1.5e9}),
            _cfg(model_dir, seed=5, num_generations=4, num_update_generations=None, **base)]


def _close(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        math.isclose(a[k], b[k], rel_tol=1e-4, abs_tol=1e-6) if k in LOSS_KEYS else a[k] == b[k] for k in a)


def _strip(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("seconds")} for r in rows]


def test_gang_members_that_differ_in_the_knob_write_their_solo_runs(tiny_model_dir, tmp_path):
    from race.engines import run_engine
    from race.engines.gang import run_gang

    cfgs = _members(tiny_model_dir)
    outs = run_gang([(c, tmp_path / f"g{i}") for i, c in enumerate(cfgs)], tmp_path / "gang")
    for i, (c, out) in enumerate(zip(cfgs, outs)):
        solo = run_engine(c, tmp_path / f"s{i}")
        g, s = tmp_path / f"g{i}", tmp_path / f"s{i}"
        assert _strip(_lines(g / "ledger.jsonl")) == _strip(_lines(s / "ledger.jsonl")), i
        gm, sm = _lines(g / "metrics.jsonl"), _lines(s / "metrics.jsonl")
        assert len(gm) == len(sm) and all(_close(a, b) for a, b in zip(gm, sm)), i
        for k in ("steps", "total_flops", "phase_flops", "status", "stop_reason", "run_id"):
            assert out[k] == solo[k], (i, k)
        assert out["steps"] >= 3
    kept = [[x["kept_sequences"] for x in _lines(tmp_path / f"g{i}" / "metrics.jsonl") if x.get("kind") == "train"]
            for i in range(3)]
    assert all(k % 3 == 0 for k in kept[0]) and all(k % 2 == 0 for k in kept[1]) and max(kept[0]) <= 12


def test_a_gang_step_executes_what_the_member_ledgers_charge(tiny_model_dir, tmp_path, gang_step_flops):
    """Under torch conventions FlopCounterMode over a gang step equals the members' charged
    learning passes (over their m kept rows) plus the rollout the gang executed."""
    from race.engines.gang import run_gang

    measured, executed = gang_step_flops
    cfgs = [c.model_copy(update={"conventions": "torch", "max_steps": 3}) for c in _members(tiny_model_dir)]
    run_gang([(c, tmp_path / f"g{i}") for i, c in enumerate(cfgs)], tmp_path / "gang")
    ledgers = [_lines(tmp_path / f"g{i}" / "ledger.jsonl") for i in range(len(cfgs))]
    assert len(measured) == 3
    for step, flops in measured.items():
        charged = sum(r["flops"] for i, led in enumerate(ledgers) if i in executed[step] for r in led
                      if r["step"] == step and r["counted"] and r["phase"] != "rollout")
        assert flops == charged + sum(executed[step].values()), step
