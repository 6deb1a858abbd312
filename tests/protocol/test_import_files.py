"""`race import` of a CSV / JSONL of evaluations (a synthetic study written by a script here:
2 allocations x 3 seeds x 6 evaluation points with per-problem outcomes): the store it writes
is a normal study (load_tables, load_study, `race report`); tokens are charged by RACE's
accounting; every malformed input is refused with what to add or fix."""

from __future__ import annotations

import csv
import json
import math
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from race.cli.app import app

N_PROBLEMS = 30
STEPS = (0, 10, 20, 30, 40, 50)
FIELDS = {"model": "tiny-s", "prompts_per_step": 8, "num_iterations": 1, "learning_rate": 1e-4, "reward": "rule"}


def study_rows(seed: int = 0) -> list[dict]:
    """The synthetic study: G=4 and G=8 (the latter learns faster and costs twice the FLOPs
    per step), 3 seeds each; per-problem outcomes drawn around a saturating curve, one
    difficulty per problem shared by every run (the same problems, the same order)."""
    rng = random.Random(seed)
    ease = [rng.random() for _ in range(N_PROBLEMS)]
    rows = []
    for g, rate in ((4, 0.6), (8, 1.0)):
        for s in (0, 1, 2):
            for k, step in enumerate(STEPS):
                acc = 0.15 + 0.55 * (1 - math.exp(-rate * k))
                pp = [int(rng.random() < min(1.0, acc * (0.5 + e))) for e in ease]
                rows.append({"run": f"g{g}/seed{s}", **FIELDS, "num_generations": g, "seed": s, "step": step,
                             "flops": step * 1.0e9 * g, "prompt_tokens": step * 8 * g * 20,
                             "completion_tokens": step * 8 * g * 30, "score": sum(pp) / N_PROBLEMS,
                             "n": N_PROBLEMS, "per_problem": pp})
    return rows


def write_csv(path: Path, rows: list[dict], drop: tuple[str, ...] = ()) -> Path:
    keys = [k for k in rows[0] if k not in drop]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in r.items() if k in keys})
    return path


def write_jsonl(path: Path, rows: list[dict], drop: tuple[str, ...] = ()) -> Path:
    path.write_text("".join(json.dumps({k: v for k, v in r.items() if k not in drop}) + "\n" for r in rows))
    return path


def _cli(*args):
    res = CliRunner(env={"COLUMNS": "200"}).invoke(app, [str(a) for a in args])
    return res.exit_code, res.output


def test_csv_study_imports_as_a_normal_study_and_race_report_reads_it(tmp_path):
    from race.analysis import allocation_key
    from race.grid import load_tables
    from race.protocol import load_study

    rows = study_rows()
    src = write_csv(tmp_path / "runs.csv", rows, drop=("prompt_tokens", "completion_tokens"))
    code, out = _cli("import", src, "--study-dir", tmp_path / "s")
    assert code == 0, out
    assert "imported 6 run(s), 2 allocation(s)" in out and "as the file gives them" in out
    t = load_tables(tmp_path / "s")
    runs, evals = t["runs"], t["evals"]
    assert sorted(runs["run_id"]) == ["g4-seed0", "g4-seed1", "g4-seed2", "g8-seed0", "g8-seed1", "g8-seed2"]
    assert allocation_key(runs).nunique() == 2 and set(runs["status"]) == {"complete"}
    assert runs["budget"].nunique() == 1 and runs["budget"].iloc[0] == max(r["flops"] for r in rows)  # one budget
    assert dict(zip(runs["run_id"], runs["total_flops"])) == {"g4-seed0": 2e11, "g4-seed1": 2e11, "g4-seed2": 2e11,
                                                             "g8-seed0": 4e11, "g8-seed1": 4e11, "g8-seed2": 4e11}
    assert set(runs["model_params"]) == {301200.0} and set(runs["engine"].fillna("")) == {""}
    assert len(evals) == len(rows)
    got = evals.sort_values(["run_id", "step"]).reset_index(drop=True)
    want = sorted(rows, key=lambda r: (r["run"].replace("/", "-"), r["step"]))
    assert list(got["score"]) == [r["score"] for r in want] and list(got["flops"]) == [r["flops"] for r in want]
    assert [list(p) for p in got["per_problem"]] == [r["per_problem"] for r in want]
    assert set(got["target"]) == {"greedy"} and set(got["n"]) == {N_PROBLEMS}
    study = load_study(tmp_path / "s")
    assert study.imported is not None and study.primary_target == "greedy"
    assert any("ended between 2e+11 and 4e+11" in n for n in study.notes)  # a caveat, stored with the study
    code, out = _cli("report", tmp_path / "s", "--n-boot", "50", "--n-boot-fit", "20")
    assert code == 0, out
    md = (tmp_path / "s" / "report" / "report.md").read_text()
    assert "FLOPs as the file gives them" in md and "ended between" in md
    assert "the study was imported (race import)" in md  # the validation section says why RACE cannot validate it
    code, out = _cli("validate", tmp_path / "s")
    assert code != 0 and "was imported" in out
    # the racing decisions read it as a study RACE ran: a last-rung decision keeps one allocation
    from race.analysis.racing import RacingRule, rung_decision

    b = float(runs["budget"].iloc[0])
    sched = RacingRule(n_boot=50).schedule(sorted(set(runs["model"])), 4 * b, first_seeds=2, rungs=[b / 2, b])
    d = rung_decision(runs, evals, schedule=sched, rung=1, rule=RacingRule(n_boot=50))
    assert d.leader in set(allocation_key(runs)) and list(d.go_on) == [d.leader] and len(d.stopped) == 1


def test_jsonl_tokens_are_charged_by_races_accounting(tmp_path):
    """Token columns instead of FLOPs: each interval's sequences (step x prompts x G) at
    even lengths, charged as TRL runs a step; `tokens` + `completion_tokens` is the same
    as `prompt_tokens` + `completion_tokens`; uneven evaluation points are a caveat."""
    from race.accounting import PolicyCost
    from race.accounting.guard import counted
    from race.accounting.trl_step import TrlStepPlan, trl_tokens_components
    from race.models.refs import resolve_shape
    from race.protocol.imports import import_study

    rows = [r for r in study_rows() if not (r["run"] == "g8/seed2" and r["step"] == 30)]  # one point fewer
    src = write_jsonl(tmp_path / "runs.jsonl", rows, drop=("flops",))
    res = import_study([src], tmp_path / "s")
    assert {r.flops_from for r in res.runs} == {"tokens"} and res.runs[0].lora is None
    assert any("evaluation points differ" in c for c in res.caveats)
    assert any("charged by RACE from the logged token counts" in c and "full fine-tuning" in c for c in res.caveats)
    policy = PolicyCost(resolve_shape("tiny-s"), None, "race")
    run = next(r for r in res.runs if r.name == "g8/seed0")
    # TRL's defaults: gradient checkpointing on; the fused head at completion tokens (import's default)
    plan = TrlStepPlan(per_device_train_batch_size=8, num_generations=8, compact_head=True)
    per_interval = counted(trl_tokens_components(plan, policy, n_seqs=10 * 8 * 8, prompt_tokens=10 * 8 * 8 * 20,
                                                 completion_tokens=10 * 8 * 8 * 30, recompute="early_stop"))
    assert [e["flops"] for e in run.evals] == [k * per_interval for k in range(6)]
    alt = [{**{k: v for k, v in r.items() if k != "prompt_tokens"},
            "tokens": r["prompt_tokens"] + r["completion_tokens"]} for r in rows]
    res2 = import_study([write_jsonl(tmp_path / "alt.jsonl", alt, drop=("flops",))], tmp_path / "s2")
    assert [e["flops"] for r in res2.runs for e in r.evals] == [e["flops"] for r in res.runs for e in r.evals]


def _refused(tmp_path, rows, match, fmt="csv", **kw):
    from race.protocol.imports import ImportRefused, import_study

    write = write_csv if fmt == "csv" else write_jsonl
    src = write(tmp_path / f"bad.{fmt}", rows)
    with pytest.raises(ImportRefused, match=match):
        import_study([src], tmp_path / "s", **kw)


def test_malformed_files_are_refused_with_what_to_fix(tmp_path):
    rows = study_rows()
    drop = lambda *cols: [{k: v for k, v in r.items() if k not in cols} for r in rows]  # noqa: E731
    _refused(tmp_path, drop("n", "seed"), r"missing column\(s\) n, seed")
    _refused(tmp_path, drop("flops", "prompt_tokens"), r"flops \(or prompt_tokens and completion_tokens\)")
    bad = [dict(r) for r in rows]
    bad[3]["flops"] = 1.0  # step 30 of g4/seed0 below its step 20
    _refused(tmp_path, bad, "not monotone: 8e\\+10 at step 20, 1 at step 30")
    _refused(tmp_path, [r for r in rows if r["seed"] == 0], "2 allocation\\(s\\) have one seed.*--allow-one-seed")
    bad = [dict(r) for r in rows]
    bad[7] = {**bad[7], "score": 7.5, "per_problem": None}
    _refused(tmp_path, [{k: v for k, v in r.items() if v is not None} for r in bad], "score 7.5 is outside \\[0, 1\\]",
             fmt="jsonl")
    _refused(tmp_path, [r for r in rows if not (r["run"] == "g8/seed1" and r["step"] == 0)],
             "run g8/seed1 has no step-0 greedy evaluation")
    _refused(tmp_path, [{**r, "model": "my-policy-7b"} for r in rows], "model 'my-policy-7b' is unknown.*--model")
    _refused(tmp_path, [{**r, "run": r["run"].replace("seed2", "seed1")} for r in rows], "two values of seed")
    _refused(tmp_path, rows + [{**r, "run": "copy"} for r in rows if r["run"] == "g4/seed0"], "both seed 0")
    _refused(tmp_path, [{**r, "group_size": 4} for r in rows], "group_size: not a setting RACE knows")
    _refused(tmp_path, [{**r, "per_problem": r["per_problem"][:-1]} for r in rows], "n=30 outcomes")
    _refused(tmp_path, [{**r, "reward": "accuracy"} for r in rows], "reward")
    _refused(tmp_path, [{**r, "flops": r["flops"] + 5.0} for r in rows], "step 0 is the base model")
    _refused(tmp_path, rows, "--target 'pass@1' is not evaluated", target="pass@1")
    _refused(tmp_path, [{**r, "budget": 3e11} for r in rows],
             "run g8/seed0 counted 4e\\+11 FLOPs, more than its budget")


def test_unknown_model_maps_through_model_and_one_seed_is_allowed_for_the_report(tmp_path):
    from race.protocol.imports import import_study

    rows = [{**r, "model": "my-policy"} for r in study_rows() if r["seed"] == 0]
    src = write_csv(tmp_path / "runs.csv", rows)
    res = import_study([src], tmp_path / "s", models=["my-policy=tiny-m"], allow_one_seed=True)
    from race.models.refs import resolve_shape

    assert {r.shape for r in res.runs} == {resolve_shape("tiny-m")}
    assert any("have one seed" in c for c in res.caveats)
    code, out = _cli("report", tmp_path / "s", "--n-boot", "20", "--n-boot-fit", "10")
    assert code == 0, out


def test_a_study_dir_is_not_overwritten(tmp_path):
    from race.protocol.imports import ImportRefused, import_study

    src = write_csv(tmp_path / "runs.csv", study_rows())
    import_study([src], tmp_path / "s")
    with pytest.raises(ImportRefused, match="--replace"):
        import_study([src], tmp_path / "s")
    import_study([src], tmp_path / "s", replace=True)
    code, out = _cli("import", src, "--study-dir", tmp_path / "s")  # the CLI: one line, exit 2
    assert code == 2 and "error: " in out and "--replace" in out
    (tmp_path / "runs.txt").write_text("")
    with pytest.raises(ImportRefused, match="cannot tell its format"):
        import_study([tmp_path / "runs.txt"], tmp_path / "t")
    with pytest.raises(ImportRefused, match="--format 'yaml'"):
        import_study([src], tmp_path / "t", fmt="yaml")
    with pytest.raises(ImportRefused, match="--set seed=5"):
        import_study([src], tmp_path / "t", settings={"seed": 5})
    import_study([src], tmp_path / "u", settings={"learning_rate": "1e-4"})  # the same number, written otherwise


def test_a_study_race_ran_is_never_replaced(tmp_path):
    from race.grid import Store
    from race.protocol.imports import ImportRefused, import_study

    with Store(tmp_path / "grid") as store:
        store.register_study("grid", json.dumps({"study": "grid", "budgets": [1e12]}))
    src = write_csv(tmp_path / "runs.csv", study_rows())
    with pytest.raises(ImportRefused, match="holds a study RACE ran"):
        import_study([src], tmp_path / "grid", replace=True)


def test_budget_levels_write_each_runs_prefixes_as_a_nested_grid_does(tmp_path):
    """--budgets: each run's budget is the smallest level it fits, and its prefix at each
    smaller level (its evaluations up to the last that fits; none below its first point) is
    written by the store as that budget's run, prefix_of the run, with those steps' FLOPs."""
    from race.grid import load_tables
    from race.protocol.imports import ImportRefused, import_study

    rows = study_rows()  # G=4: 4e10 FLOPs per 10 steps, to 2e11; G=8: 8e10, to 4e11
    src = write_csv(tmp_path / "runs.csv", rows, drop=("prompt_tokens", "completion_tokens"))
    res = import_study([src], tmp_path / "s", budgets=[4e11, 5e10, 2e11, 1e11])
    assert any("stands for the run of that budget" in c for c in res.caveats)
    t = load_tables(tmp_path / "s")
    runs = t["runs"].set_index("run_id")
    cols = ["budget", "total_flops", "steps", "prefix_of"]
    assert runs.loc["g4-seed0", "budget"] == 2e11 and runs.loc["g8-seed0", "budget"] == 4e11
    assert runs.loc["g4-seed0.p0", cols].tolist() == [5e10, 4e10, 10, "g4-seed0"]
    assert runs.loc["g4-seed0.p1", cols].tolist() == [1e11, 8e10, 20, "g4-seed0"]
    assert runs.loc["g8-seed0.p0", cols].tolist() == [1e11, 8e10, 10, "g8-seed0"]  # nothing fits 5e10 but step 0
    assert runs.loc["g8-seed0.p1", cols].tolist() == [2e11, 1.6e11, 20, "g8-seed0"]
    assert len(runs) == 6 + 6 * 2 and set(runs.loc[runs["prefix_of"].notna(), "own_flops"]) == {0.0}
    ev = t["evals"]
    assert sorted(ev.loc[ev["run_id"] == "g8-seed0.p1", "step"]) == [0, 10, 20]
    with pytest.raises(ImportRefused, match="more than the largest of --budgets"):
        import_study([src], tmp_path / "t", budgets=[1e11])
    cosine = write_csv(tmp_path / "cos.csv", [{**r, "lr_scheduler_type": "cosine"} for r in rows])
    with pytest.raises(ImportRefused, match="constant learning rate"):
        import_study([cosine], tmp_path / "u", budgets=[4e11])
