"""Which rollouts the update trains on (``num_update_generations``, PODS): the
max-variance rule against brute force over every m-subset, PODS's shape of the optimum (the
top k and bottom m - k), the random control's draws, the selection table, the run file's
refusals, the TRL engine's refusal, and the accounting: rollout and reward for all n, the
learning passes for the m chosen."""

from __future__ import annotations

import itertools
import random
from fractions import Fraction

import pytest

from race.accounting import AccountingError, ModelShape, StepPlan, update_share
from race.accounting.grpo import update_rows
from race.engines.checks import engine_refusal
from race.engines.selection import max_variance, rule, uniform
from race.spec import ConfigError
from race.spec.run import run_config_from_dict
from race.spec.selection import UPDATE_SELECTIONS


def _var(xs: list[float]) -> Fraction:
    """The population variance, exactly (the rewards as fractions)."""
    f = [Fraction(x) for x in xs]
    mean = sum(f) / len(f)
    return sum((x - mean) ** 2 for x in f) / len(f)


def _groups(rng: random.Random, kind: str, n: int) -> list[float]:
    if kind == "binary":
        return [float(rng.random() < 0.4) for _ in range(n)]
    if kind == "graded":  # partial credit: few levels, many ties
        return [rng.choice([0.0, 0.25, 0.5, 0.75, 1.0]) for _ in range(n)]
    return [rng.gauss(0.0, 1.0) for _ in range(n)]  # a PRM's real-valued scores


@pytest.mark.parametrize("kind", ["binary", "graded", "real"])
def test_max_variance_is_the_best_subset_and_the_top_k_bottom_m_minus_k(kind):
    """On 400 random groups of 2-9 rewards and every m: the chosen subset's variance equals
    the largest over all C(n, m) subsets (exact arithmetic), and the chosen subset is the k
    highest and m - k lowest rewards (ordered by value, then index) for some k."""
    rng = random.Random(7)
    for _ in range(400):
        n = rng.randint(2, 9)
        r = _groups(rng, kind, n)
        for m in range(1, n + 1):
            got = max_variance(r, m)
            assert got == sorted(set(got)) and len(got) == m
            best = max(_var([r[i] for i in c]) for c in itertools.combinations(range(n), m))
            assert _var([r[i] for i in got]) == best, (r, m, got)
            order = sorted(range(n), key=lambda i: (r[i], i))
            assert any(sorted(order[:m - k] + order[n - k:]) == got for k in range(m + 1)), (r, m, got)


def test_max_variance_ties_keep_more_high_rewards():
    # 3 correct of 8, m = 3: {1, 1, 0} and {1, 0, 0} tie; the rule keeps two correct (the latest
    # correct rows, the earliest wrong one)
    r = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    assert max_variance(r, 3) == [1, 2, 5]
    assert max_variance(r, 2) == [1, 5]  # one of each: the largest variance
    assert max_variance([0.5] * 6, 4) == [2, 3, 4, 5]  # all equal: every k ties, k = m: the "highest" (latest) m
    with pytest.raises(ValueError, match="m must be a whole number in 1..3"):
        max_variance([0.0, 1.0, 0.0], 4)
    with pytest.raises(ValueError, match="must be finite"):
        max_variance([0.0, float("nan")], 1)


def test_uniform_draws_every_subset_equally_often_and_repeats_under_a_seed():
    """6,000 draws of 2 of 4: each of the 6 subsets about 1,000 times (binomial sd 29; 5 sd
    allowed); a generator seeded alike draws alike; the rewards are not read."""
    rng = random.Random(11)
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(6000):
        got = tuple(uniform([0.0, 1.0, 0.0, 1.0], 2, rng))
        counts[got] = counts.get(got, 0) + 1
    assert set(counts) == set(itertools.combinations(range(4), 2))
    sd = (6000 * (1 / 6) * (5 / 6)) ** 0.5
    assert all(abs(c - 1000) < 5 * sd for c in counts.values()), counts
    assert uniform([0.0] * 8, 3, random.Random(3)) == uniform([1.0] * 8, 3, random.Random(3))


def test_every_row_of_the_table_names_its_rule():
    assert set(UPDATE_SELECTIONS) == {"max_variance", "random"}
    assert rule("max_variance") is max_variance and rule("random") is uniform
    assert not UPDATE_SELECTIONS["max_variance"].draws and UPDATE_SELECTIONS["random"].draws


@pytest.mark.parametrize("settings, needle", [
    (dict(num_update_generations=1), "num_update_generations=1: the update's advantages are relative"),
    (dict(num_update_generations=9), "num_update_generations=9 > num_generations=8"),
    (dict(update_selection="random"), "but num_update_generations is null"),
    (dict(num_update_generations=4, update_selection="top"), "'top' is not an update selection: choose one of "
                                                             "max_variance, random"),
    (dict(num_update_generations=4, prompts_per_step=3, steps_per_generation=8),
     "does not divide prompts_per_step x num_update_generations = 12 sequences"),
    (dict(num_update_generations=4, prompts_per_step=4, per_device_train_batch_size=8, steps_per_generation=4),
     "but prompts_per_step x num_update_generations = 16: the update trains on 16 sequences per step; set "
     "steps_per_generation: 2"),
    (dict(num_update_generations=3, per_device_train_batch_size=4, steps_per_generation=2),
     "not a multiple of num_update_generations=3"),
])
def test_the_run_file_refuses_what_cannot_run_saying_what_to_change(settings, needle):
    with pytest.raises(ConfigError) as e:
        run_config_from_dict({"budget_flops": 1e12, "num_generations": 8, **settings})
    assert needle in str(e.value)


def test_batch_sizes_describe_the_update_and_the_id_holds_when_unset():
    base = {"budget_flops": 1e12, "num_generations": 8}
    c = run_config_from_dict({**base, "num_update_generations": 4, "per_device_train_batch_size": 8,
                              "steps_per_generation": 2})
    assert (c.prompts_per_step, c.update_generations, c.micro_batch_size) == (4, 4, 8)  # 4 prompts x 4 trained
    c = run_config_from_dict({**base, "prompts_per_step": 4, "num_update_generations": 2})
    assert c.micro_batch_size == 8 and c.update_generations == 2
    plain = run_config_from_dict(base)
    assert plain.update_generations == 8
    assert plain.run_id() == run_config_from_dict({**base, "update_selection": "max_variance"}).run_id()
    ids = {run_config_from_dict({**base, **s}).run_id() for s in (
        {}, {"num_update_generations": 4}, {"num_update_generations": 4, "update_selection": "random"})}
    assert len(ids) == 3


def test_the_trl_engine_refuses_the_setting_and_says_what_trl_cannot_do():
    cfg = run_config_from_dict({"budget_flops": 1e12, "engine": "trl", "num_generations": 8,
                                "num_update_generations": 4})
    why = engine_refusal(cfg)
    assert why is not None and "engine: trl refuses this cell" in why
    assert "before the rewards exist" in why and "set engine: builtin" in why
    assert engine_refusal(cfg.model_copy(update={"num_update_generations": None})) is None


SHAPE = ModelShape.from_preset("qwen2.5-0.5b")


@pytest.mark.parametrize("share", [False, True])
def test_the_step_charges_rollout_and_reward_for_n_and_learning_for_m(share):
    """G=8 training on 4: rollout as the G=8 step's; old-policy, reference and update (two
    iterations, beta on) as a G=4 step's over the same prompts; so p falls with m."""
    kw = dict(num_iterations=2, beta=0.04, share_prompt=share, micro_batch=8 if share else None)
    sub = StepPlan(SHAPE, 8, update_generations=4, **kw).uniform(4, 64, 32)
    full = StepPlan(SHAPE, 8, **kw).uniform(4, 64, 32)
    half = StepPlan(SHAPE, 4, **kw).uniform(4, 64, 32)
    assert sub.rollout == full.rollout and sub.reward == full.reward
    for phase in ("old_logprobs", "reference", "update"):
        assert getattr(sub, phase) == getattr(half, phase) > 0
    assert sub.total == full.total - (full.update - half.update) - (full.old_logprobs - half.old_logprobs) - (
        full.reference - half.reference)
    ps = [update_share(StepPlan(SHAPE, 8, update_generations=m).uniform(4, 64, 32))["p"] for m in (8, 6, 4, 2)]
    assert ps == sorted(ps, reverse=True) and ps[-1] < 0.5 < ps[0]
    assert StepPlan(SHAPE, 8, update_generations=8).uniform(4, 64, 32) == StepPlan(SHAPE, 8).uniform(4, 64, 32)


def test_the_learning_passes_run_over_the_rows_given():
    """``update``: which sequences the update trains on; their own lengths are charged."""
    plan = StepPlan(SHAPE, 4, update_generations=2)
    plens, clens = [10] * 8, [5, 9, 3, 7, 2, 8, 4, 6]
    step = plan.step(plens, clens, update=[1, 3, 4, 6])
    alone = StepPlan(SHAPE, 2).step([10] * 4, [9, 7, 2, 4])
    assert step.update == alone.update and step.rollout == StepPlan(SHAPE, 4).step(plens, clens).rollout
    assert update_rows(plan, 8) == [0, 1, 4, 5]  # default: the first m of each group
    assert plan.bound(2, 10, 9) == StepPlan(SHAPE, 4).uniform(2, 10, 9).rollout + StepPlan(SHAPE, 2).uniform(
        2, 10, 9).update
    with pytest.raises(AccountingError, match="distinct ascending indices"):
        plan.step(plens, clens, update=[3, 1, 4, 6])
    with pytest.raises(AccountingError, match="update_generations=5: the update trains on 2..num_generations=4"):
        StepPlan(SHAPE, 4, update_generations=5)
