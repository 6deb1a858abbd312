"""The held-out protocol of race.builds.rm_eval on known answers, and the policy samples
it runs on (race.builds.rm_samples)."""

from __future__ import annotations

import pytest

from race.builds import rm_eval as V
from race.builds import rm_samples as S
from race.builds.rm_data import marker_labels
from race.tasks import ArithTask, solution_text, verify


def test_auc_of_a_perfect_a_reversed_and_a_constant_scorer():
    labels = [1, 0, 1, 1, 0, 0, 1, 0]
    perfect = [(0.9 if y else 0.1, y) for y in labels]
    assert V.auc(perfect) == 1.0
    assert V.auc([(1 - s, y) for s, y in perfect]) == 0.0
    assert V.auc([(0.7, y) for y in labels]) == 0.5
    # 2 positives x 2 negatives: (0.8 > 0.3, 0.8 > 0.6, 0.5 > 0.3, 0.5 < 0.6) -> 3 of 4
    assert V.auc([(0.8, 1), (0.5, 1), (0.3, 0), (0.6, 0)]) == 0.75


def test_youden_threshold_separates_separable_scores_and_recall_counts_below_it():
    pairs = [(0.95, 1), (0.8, 1), (0.7, 1), (0.4, 0), (0.2, 0), (0.1, 0)]
    t = V.youden_threshold(pairs)
    assert 0.4 < t < 0.7 and t == (0.4 + 0.7) / 2
    assert V.recall_below(pairs, t) == (1.0, 1.0)
    assert V.recall_below(pairs, 0.15) == (1 / 3, 1.0)  # only 0.1 lies below
    assert V.recall_below([(0.3, 1)], 0.5) == (0.0, 0.0)  # no bad step; the good one is missed
    # overlapping classes: the best cut flags 0.6 (bad) with 0.55 (good), J = 1 - 1/3 + ... checked by brute force
    mixed = [(0.9, 1), (0.55, 1), (0.65, 1), (0.6, 0), (0.3, 0), (0.5, 0)]
    t = V.youden_threshold(mixed)
    best = max(sum(V.recall_below(mixed, c)) for c in [0.4, 0.525, 0.575, 0.625, 0.775])
    assert sum(V.recall_below(mixed, t)) == best


def test_labelled_reads_steps_before_the_final_mark_and_the_trajectory_minimum():
    task = ArithTask()
    p = task.problems("test", 1, seed=3)[0]
    ref = solution_text(p)
    a, op, b, c = p.steps[0]
    slip = ref.replace(f"{a}{op}{b}={c};", f"{a}{op}{b}={c + 1};", 1)
    pairs = [(p, ref), (p, slip), (p, ref[:-1])]  # the last never closes its answer
    rows = [[0.9] * (p.n_ops + 1), [0.2] + [0.8] * p.n_ops, [0.7] * (p.n_ops + 1)]
    steps, outcomes = V.labelled("prm", pairs, rows)
    assert len(steps) == 3 * p.n_ops
    assert steps[p.n_ops] == (0.2, 0)  # the slipped step is bad
    assert [y for _, y in steps[: p.n_ops]] == [1] * p.n_ops
    assert outcomes == [(0.9, 1), (0.2, int(verify(p, slip).correct)), (0.0, 0)]
    assert marker_labels(p, slip)[0] == 0


def test_problem_of_round_trips_and_refuses_non_expressions():
    for p in ArithTask().problems("train", 20, seed=5):
        assert S.problem_of(p.expression) == p
    for bad in ("", "12", "1+", "1*2", "1+2)", "__import__('os')"):
        with pytest.raises(ValueError):
            S.problem_of(bad)


def test_sample_sets_are_disjoint_where_the_protocol_says():
    task = ArithTask()
    train = S.set_problems(task, S.SampleSet("train", ("tiny-s",), 200))
    pool = {p.expression for p in train}
    val = S.set_problems(task, S.SampleSet("val", ("tiny-s",), 100), exclude=pool)
    held = S.set_problems(task, S.SampleSet("heldout", ("tiny-s",), 100))
    assert len(val) == 100 and not pool & {p.expression for p in val}
    assert {p.split for p in held} == {"test"} and not pool & {p.expression for p in held}
    with pytest.raises(ValueError, match="kind"):
        S.SampleSet("dev", ("tiny-s",), 3)
    with pytest.raises(ValueError, match="policies"):
        S.SampleSet("train", (), 3)


def test_policy_samples_are_cached_deterministic_and_charged(_race_cache):
    from race.accounting import generate_flops
    from race.models.family import tiny_config_kwargs  # noqa: F401  (the policy is a tiny size)

    task = ArithTask()
    s = S.SampleSet("heldout", ("tiny-s",), 6, seed=11)
    got = S.load_samples(task, s)
    assert len(got["pairs"]) == 6 and {name for _, _, name in got["pairs"]} == {"tiny-s"}
    files = list((_race_cache / "rm-samples").glob(f"heldout-{got['digest']}.json"))
    assert len(files) == 1
    again = S.load_samples(task, s)  # read back from the cache
    assert [(p.expression, c) for p, c, _ in again["pairs"]] == [(p.expression, c) for p, c, _ in got["pairs"]]
    files[0].unlink()
    fresh = S.load_samples(task, s)  # sampled again under the same seed
    assert [c for _, c, _ in fresh["pairs"]] == [c for _, c, _ in got["pairs"]]
    # the FLOPs are generate_flops of the one padded batch (6 rows, prompt P, T new tokens)
    from race.models.loading import load_policy
    from race.models.refs import model_shape

    model, tok = load_policy("tiny-s", device="cpu")
    P = max(len(p.prompt) for p, _, _ in got["pairs"])
    T = got["flops"]["tiny-s"]
    candidates = {t: generate_flops(model_shape(model), [P] * 6, [t] * 6) for t in range(1, s.max_new_tokens + 1)}
    longest = max(len(c) for _, c, _ in got["pairs"])
    assert T in candidates.values()
    assert T >= candidates[longest]  # at least the longest completion's decode ran for every row


def test_quality_of_an_oracle_a_constant_and_their_mix_by_group():
    """Rows from the verifier itself for group 'a' (a perfect scorer) and 0.5 for group
    'b' (a constant one): AUC 1 and 0.5 per group, the pooled AUC between, recall 1 for
    'a' at the threshold chosen on the oracle's validation rows."""
    problems = ArithTask().problems("test", 8, seed=4)
    slips = []
    for p in problems:
        a, op, b, c = p.steps[0]
        slips.append(solution_text(p).replace(f"{a}{op}{b}={c};", f"{a}{op}{b}={c + 1};", 1))
    pairs = [(p, solution_text(p)) for p in problems] + list(zip(problems, slips))
    groups = ["a", "b"] * 8
    oracle = [[float(y) for y in marker_labels(p, c)] for p, c in pairs]
    rows = [r if g == "a" else [0.5] * len(r) for r, g in zip(oracle, groups)]
    res = V.quality_of_rows("prm", pairs, oracle, pairs, rows, groups)
    assert 0.0 < res["threshold"] <= 1.0
    assert res["by_group"]["a"]["step_auc"] == 1.0 and res["by_group"]["b"]["step_auc"] == 0.5
    assert res["by_group"]["a"]["bad_step_recall"] == 1.0
    assert 0.5 < res["step_auc"] < 1.0
    assert sum(g["n_steps"] for g in res["by_group"].values()) == res["n_steps"]
    perfect = V.quality_of_rows("prm", pairs, oracle, pairs, oracle)
    assert perfect["step_auc"] == 1.0 and perfect["bad_step_recall"] == 1.0 == perfect["good_step_recall"]
    assert "by_group" not in perfect
