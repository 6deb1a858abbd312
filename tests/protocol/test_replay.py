"""`race replay`: pilot designs replayed on complete trajectories (race.protocol.replay).

An imported study of complete trajectories (a CSV written here: every allocation to T with 3
seeds, read at 8 budgets) replays every design of race.analysis.designs against its own truth
at T, from the library, the CLI and the report; a study that is not complete is refused with
what to run; and on a small real study the replay's race decides exactly as `race grid run`
of a `protocol: race` grid on the same allocations, seeds and rungs does."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from race.cli.app import app

N = 60
T = 2.56e11
READS = [T / 2 ** k for k in range(7, -1, -1)]  # T/128 ... T: 8 budgets
FIELDS = {"model": "tiny-s", "prompts_per_step": 8, "num_iterations": 1, "reward": "rule"}
#: (num_generations, learning rate, asymptote, rate): the low rate trails early and wins at T
ALLOCS = ((4, 3e-4, 0.62, 1.2), (4, 1e-4, 0.75, 0.45), (8, 3e-4, 0.55, 0.8))


def study_rows(seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    ease = [rng.random() for _ in range(N)]
    rows = []
    for g, lr, top, rate in ALLOCS:
        for s in (0, 1, 2):
            off = rng.gauss(0, 0.02)
            for k, flops in enumerate([0.0, *READS]):
                acc = 0.2 + (top - 0.2) * (1 - math.exp(-rate * k)) + (off if k else 0.0)
                pp = [int(rng.random() < min(1.0, max(0.0, acc * (0.5 + e)))) for e in ease]
                rows.append({"run": f"g{g}-lr{lr:g}/seed{s}", **FIELDS, "num_generations": g, "learning_rate": lr,
                             "seed": s, "step": 10 * k, "flops": flops, "score": sum(pp) / N, "n": N,
                             "per_problem": json.dumps(pp)})
    return rows


@pytest.fixture(scope="module")
def complete(tmp_path_factory) -> Path:
    import csv

    from race.protocol.imports import import_study

    d = tmp_path_factory.mktemp("replay")
    rows = study_rows()
    with (d / "runs.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    import_study([d / "runs.csv"], d / "study", budgets=READS)
    return d / "study"


def test_every_design_is_replayed_and_scored_against_the_studys_own_truth(complete):
    from race.analysis.designs import DESIGNS
    from race.grid import load_tables
    from race.protocol.replay import StudySource, replay, replay_table

    t = load_tables(complete)
    out = replay(t["runs"], t["evals"], n_boot=300)
    assert out["target_budget"] == pytest.approx(T) and out["seeds"] == [0, 1, 2] and len(out["reads"]) == 8
    src = StudySource(t["runs"], t["evals"])
    truth, R = src.truth(n_boot=300)
    assert out["truth"] == truth and max(truth, key=truth.get) == out["best"]
    assert set(out["designs"]) == set(DESIGNS)
    for name, r in out["designs"].items():
        assert r["pick"] in truth
        assert r["regret"] == pytest.approx(truth[out["best"]] - truth[r["pick"]], abs=1e-12)
        reg = R.max(axis=1) - R[:, src.names.index(r["pick"])]
        assert (r["regret_lo"], r["regret_hi"]) == (float(np.quantile(reg, 0.025)), float(np.quantile(reg, 0.975)))
        assert 0 <= r["unreused"] <= r["pilot"] and r["best_alive"] == (out["best"] in r["alive_last"])
        for b in r.get("rungs") or []:
            assert any(abs(b - x) <= 1e-9 * x for x in src.reads)  # a replay reads only what the study evaluated
    text = replay_table(out)
    assert "| default |" in text and "| flat |" in text and "regret [95%" in text


def test_race_replay_and_race_report_read_the_imported_study(complete):
    res = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["replay", str(complete), "--design", "default", "--design",
                                                         "flat", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert set(out["designs"]) == {"default", "flat"}
    res = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["report", str(complete)])
    assert res.exit_code == 0, res.output
    report = json.loads((complete / "report" / "report.json").read_text())
    sec = report["sections"]["replay"]
    assert sec["data"]["designs"]["default"]["pick"] == out["designs"]["default"]["pick"]


def test_a_study_that_is_not_complete_is_refused_with_what_to_run(complete, tmp_path):
    from race.grid import load_tables
    from race.protocol import ReportError
    from race.protocol.replay import StudySource

    t = load_tables(complete)
    runs, evals = t["runs"], t["evals"]
    one = runs[runs["seed"] == 0]
    with pytest.raises(ReportError, match="2 or more seeds"):
        StudySource(one, evals)
    short = runs[~((runs["num_generations"] == 8) & (runs["budget"] > T / 2))]
    with pytest.raises(ReportError, match="did not run to the target budget"):
        StudySource(short, evals)
    few = runs[runs["budget"] >= T / 4]
    with pytest.raises(ReportError, match="read at 3 budget"):
        StudySource(few, evals)
    res = CliRunner().invoke(app, ["replay", str(tmp_path)])
    assert res.exit_code != 0


@pytest.mark.slow
def test_the_replays_race_decides_as_the_racing_grid_on_the_same_allocations(tiny_model_dir, tmp_path):
    """A nested study of every allocation to T (read at the rungs) and a `protocol: race` grid with
    those rungs, on the same allocations and seeds, real built-in engine runs: the replay's race
    makes the racing grid's every decision and pick."""
    from race.analysis.racing import RacingRule
    from race.grid import load_tables, run_grid
    from race.protocol.racing import run_race
    from race.protocol.replay import StudySource
    from race.analysis.designs import race
    from race.spec.grid import grid_spec_from_dict

    T0 = 4e9
    base = {"model": str(tiny_model_dir), "prompts_per_step": 2, "max_prompt_length": 24,
            "max_completion_length": 12, "reward": "rule:partial", "warmup_steps": 0,
            "lora": {"r": 4, "lora_alpha": 4}, "eval": {"targets": ["greedy"], "n_problems": 30, "num_points": 1}}
    common = {"base": base, "axes": {"num_generations": [2, 4], "learning_rate": [1e-3, 3e-4]}, "seeds": [0, 1],
              "require_budget_span": False, "min_steps": 1,
              "runner": {"kind": "local", "workers": 2, "threads_per_worker": 1}}
    nested = grid_spec_from_dict({**common, "study": "complete", "nested": True,
                                  "budgets": [T0 / 8, T0 / 3, T0 / 2, T0]})
    run_grid(nested, tmp_path / "complete")
    rule = {"floor_steps": 0, "n_boot": 60}
    racing = grid_spec_from_dict({**common, "study": "raced", "protocol": "race", "budgets": [],
                                  "race": {"target_budget": T0, "rungs": ["1/8", "1/3"], "rule": rule}})
    result = run_race(racing, tmp_path / "raced")
    assert result.finished and not result.failed
    t = load_tables(tmp_path / "complete")
    src = StudySource(t["runs"], t["evals"])
    replayed = race(src, RacingRule(**rule), 2, [T0 / 8, T0 / 3])
    assert [d["go_on"] for d in replayed.decisions] == [d["go_on"] for d in result.decisions]
    assert replayed.pick == result.pick
    for a, b in zip(replayed.decisions, result.decisions):
        assert [r["observed"] for r in a["rows"]] == [r["observed"] for r in b["rows"]]
