"""What feedback cost and bought, end to end: a real tiny study (built-in engine, a real
PRM arm with RACE's prm-xs built by the session's fast recipe, SQLite store) reported
with the reward model's training FLOPs left out of the pilot budget, and counted when the
grid asks (report.count_rm_training) or the report call does."""

from __future__ import annotations

import json
from html import unescape

import pytest

from race.cards import fmt_flops
from race.analysis import divergence_table

REWARDS = ["rule:partial", "prm:prm-xs:min+partial"]


def _grid(model_dir, **extra):
    return {"study": "feedback", "budgets": [3e9, 8e9], "require_budget_span": False,
            "base": {"model": str(model_dir), "prompts_per_step": 2, "num_generations": 4,
                     "max_completion_length": 12, "learning_rate": 1e-3, "torch_threads": 1,
                     "eval": {"n_problems": 6, "n_hard_problems": 2, "n_pass_problems": 2, "pass_k": 2,
                              "targets": ["greedy"], "num_points": 1}},
            "axes": {"reward": REWARDS}, "seeds": [0], "min_steps": 0, "max_retries": 0,
            "runner": {"kind": "local", "workers": 1, "threads_per_worker": 1}, **extra}


@pytest.fixture(scope="module")
def study(built_rms, tiny_model_dir, tmp_path_factory):
    from race.grid import run_grid

    path = tmp_path_factory.mktemp("feedback-study") / "study"
    res = run_grid(_grid(tiny_model_dir), path)
    assert res.ok and res.complete == 4
    return path


def _report(study, out, **kw):
    from race.report import build_report

    paths = build_report(study, out, n_boot=40, n_boot_fit=10, **kw)
    data = json.loads(paths.json.read_text())
    card = json.loads((out / "report_card.json").read_text())
    return paths, data, card


def test_the_report_shows_rm_quality_divergence_and_a_separate_rm_training_line(study, built_rms, tmp_path):
    from race.grid import load_tables

    info = built_rms["prm-xs"]
    paths, data, card = _report(study, tmp_path / "r")
    tables = load_tables(study)
    runs = tables["runs"]
    assert "feedback" not in paths.missing
    fb = data["sections"]["feedback"]["data"]
    # the RM's own quality, from its info.json, beside each allocation's feedback share
    prm_rows = [r for r in fb["allocations"] if r["reward_model"] == "prm-xs"]
    rule_rows = [r for r in fb["allocations"] if r["reward_model"] == "-"]
    assert len(prm_rows) == len(rule_rows) == 1
    assert prm_rows[0]["step_auc"] == f"{info.eval['step_auc']:.3f}"
    assert prm_rows[0]["bad_step_recall"] == f"{info.eval['bad_step_recall']:.3f}"
    prm_runs = runs[runs["reward"] == REWARDS[1]]
    share = (prm_runs["feedback_flops"] / prm_runs["total_flops"]).mean()
    assert prm_rows[0]["feedback_share"] == f"{share:.1%}" and share > 0
    assert rule_rows[0]["feedback_share"] == "0.0%"
    # the divergence point of the PRM arm: what the analysis finds on the same tables
    [div] = fb["divergence"]
    [direct] = divergence_table(runs.rename(columns={"allocation": "label"}), tables["train"]).to_dict("records")
    assert div["diverged"] == direct["diverged"] and div["step"] == direct["step"]
    assert div["run_ids"] == direct["run_ids"] == list(prm_runs.sort_values("budget")["run_id"].iloc[-1:])
    expected = (f"{fmt_flops(direct['flops'])} (step {direct['step']})" if direct["diverged"]
                else "no divergence within the pilots")
    assert prm_rows[0]["divergence"] == expected
    # did it pay: the PRM arm against the rule it mixes in, per budget, at equal FLOPs
    from race.analysis import feedback_comparisons
    from race.protocol import load_study

    st = load_study(study)
    direct = feedback_comparisons(st.evals_of(st.pilot_runs), st.pilot_runs, "greedy",
                                  {REWARDS[1]: info.eval["step_auc"]}, n_boot=40, rng=0)
    comps = fb["comparisons"]
    assert [(c["budget"], c["kind"], c["a"], c["b"]) for c in comps] == [
        (b, "RM vs its rule", REWARDS[1], "rule:partial") for b in (3e9, 8e9)]
    assert [c["diff"] for c in comps] == pytest.approx(list(direct["diff"]))
    assert [c["verdict"] for c in comps] == list(direct["verdict"])
    # RM training: a separate line, not in the total or the budget
    assert fb["rm_training_flops"] == {"prm-xs": info.train_flops} and not fb["count_rm_training"]
    assert card["rm_training_flops"] == {"prm-xs": info.train_flops} and card["count_rm_training"] is False
    assert card["total_flops"] == card["counted_flops"] == round(runs["total_flops"].sum())
    assert "rm_training" not in card["shares"]
    md = (tmp_path / "r" / "report_card.md").read_text()
    assert f"| RM training (not counted) | {fmt_flops(info.train_flops)} (prm-xs {fmt_flops(info.train_flops)}; " in md
    assert "RM training (not counted)" in (tmp_path / "r" / "report_card.tex").read_text()
    html = unescape(paths.html.read_text())
    assert "RM training: separate, NOT counted in the total or the budget" in html
    assert "Feedback: what it cost and what it bought" in html and "bad-step recall" in html


def test_rm_training_is_counted_when_the_report_is_asked(study, built_rms, tmp_path):
    info = built_rms["prm-xs"]
    paths, data, card = _report(study, tmp_path / "r", count_rm_training=True)
    runs_total = data["sections"]["card"]["data"]["total_flops"]
    assert card["count_rm_training"] is True and data["options"]["count_rm_training"] is True
    assert card["counted_flops"] == round(runs_total) + info.train_flops
    assert card["shares"]["rm_training"] == round(info.train_flops / card["counted_flops"], 6)
    md = (tmp_path / "r" / "report_card.md").read_text()
    assert f"(runs {fmt_flops(round(runs_total))} + RM training {fmt_flops(info.train_flops)})" in md
    assert "| RM training (counted) |" in md
    assert "RM training (counted, as asked)" in unescape(paths.html.read_text())


def test_the_grid_can_ask_for_it_and_the_report_call_overrides_the_grid(study, built_rms, tiny_model_dir, tmp_path):
    from race.grid import Store
    from race.protocol import load_study
    from race.spec.grid import grid_spec_from_dict

    assert load_study(study).count_rm_training is False
    spec = grid_spec_from_dict(_grid(tiny_model_dir, report={"count_rm_training": True}))
    plain = grid_spec_from_dict(_grid(tiny_model_dir))
    try:
        with Store(study) as store:
            store.register_study(spec.study, spec.model_dump_json())  # what `race grid run` records
        assert load_study(study).count_rm_training is True
        _, _, card = _report(study, tmp_path / "grid")
        assert card["count_rm_training"] is True and card["counted_flops"] > card["total_flops"]
        _, _, card = _report(study, tmp_path / "off", count_rm_training=False)
        assert card["count_rm_training"] is False and card["counted_flops"] == card["total_flops"]
    finally:  # the module's study as the other tests expect it
        with Store(study) as store:
            store.register_study(plain.study, plain.model_dump_json())


def test_race_report_flag(study, built_rms, tmp_path):
    import typer
    from typer.testing import CliRunner

    from race.cli.study_cmds import register

    app = typer.Typer()
    register(app)
    for flag, counted in (("--count-rm-training", True), ("--no-count-rm-training", False)):
        out = tmp_path / flag
        res = CliRunner().invoke(app, ["report", str(study), "--out", str(out), "--n-boot", "20", "--n-boot-fit", "10",
                                       flag])
        assert res.exit_code == 0, res.output
        assert f"report card: {out / 'report_card.md'}" in res.output
        card = json.loads((out / "report_card.json").read_text())
        assert card["count_rm_training"] is counted
        assert card["counted_flops"] == card["total_flops"] + (built_rms["prm-xs"].train_flops if counted else 0)
