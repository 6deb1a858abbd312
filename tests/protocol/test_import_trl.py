"""`race import` of real TRL output directories (trained in tests/protocol/conftest.py): the
FLOPs of an evaluation are RACE's callback's ledger where it was on, exactly; without it the
logged tokens charged by RACE's accounting equal the callback's ledger of a run with the
same shapes, and where the rows' lengths differ they lie between the unpadded charge and the
padded bound; the imported studies are normal studies that `race report` reads."""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from race.cli.app import app

from .conftest import COMPLETION, EVAL_PROBLEMS, STEPS, TRL_FIELDS


def _import(paths, study_dir, *, fields=None, **kw):
    from race.protocol.imports import import_study

    settings = {**TRL_FIELDS, "seed": 0, **(fields or {})}
    kw.setdefault("allow_one_seed", True)
    kw.setdefault("eval_problems", EVAL_PROBLEMS)
    return import_study([str(p) for p in paths], study_dir, settings=settings, compact_head=False, **kw)


def _log(run: Path) -> list[dict]:
    return json.loads((run / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())["log_history"]


def _ledger(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "ledger.jsonl").read_text().splitlines()]


def _counted_upto(ledger: list[dict], step: int) -> int:
    return sum(r["flops"] for r in ledger if r["counted"] and r["step"] <= step)


def test_callback_ledger_gives_each_evaluations_flops_exactly(trl_dirs, tmp_path):
    from race.grid import load_tables

    run = trl_dirs["ledger"]
    res = _import([run], tmp_path / "s", fields={"prompts_per_step": 2})
    (imported,) = res.runs
    assert imported.flops_from == "ledger" and imported.conventions == "race"
    ledger = _ledger(run)
    evals = [h for h in _log(run) if "eval_rewards/correct/mean" in h]
    assert [e["step"] for e in imported.evals] == [h["step"] for h in evals] == list(range(STEPS + 1))
    for e, h in zip(imported.evals, evals):
        assert e["flops"] == h["race/flops"] == _counted_upto(ledger, e["step"])  # integers: exact
        assert e["score"] == h["eval_rewards/correct/mean"] and e["target"] == "pass@1" and e["n"] == EVAL_PROBLEMS
    t = load_tables(tmp_path / "s")
    runs, stored = t["runs"], t["evals"]
    card = json.loads((run / "report_card.json").read_text())
    assert runs["total_flops"].iloc[0] == card["counted_flops"] == _counted_upto(ledger, STEPS)
    assert runs["rollout_flops"].iloc[0] == card["phase_flops"]["rollout"]
    assert runs["learning_flops"].iloc[0] == card["phase_flops"]["update"]
    assert runs["budget"].iloc[0] == card["counted_flops"] and runs["status"].iloc[0] == "complete"
    assert (runs["lora_r"].iloc[0], runs["num_generations"].iloc[0], runs["prompts_per_step"].iloc[0]) == (2, 4, 2)
    assert runs["engine"].iloc[0] == "trl"
    assert list(stored["flops"]) == [e["flops"] for e in imported.evals]
    # the base model at step 0, before any training FLOPs
    assert stored.loc[stored["step"] == 0, "flops"].tolist() == [0.0]


def test_logged_tokens_without_the_callback_equal_the_callbacks_ledger_at_equal_shapes(trl_dirs, tmp_path):
    """Two real runs with equal shapes (one prompt length, full-length completions): the run
    without RACE's callback, charged from TRL's logged tokens, counts at every evaluation
    exactly what the callback's hooks counted in the run with it."""
    plain, fixed = trl_dirs["plain"], trl_dirs["fixed"]
    assert not (plain / "ledger.jsonl").exists() and not any("race/flops" in h for h in _log(plain))
    (imported,) = _import([plain], tmp_path / "s").runs
    assert imported.flops_from == "tokens"
    ledger = _ledger(fixed)
    assert [e["flops"] for e in imported.evals] == [_counted_upto(ledger, s) for s in range(STEPS + 1)]
    assert imported.total_flops == _counted_upto(ledger, STEPS) > 0
    by_phase: dict[str, int] = defaultdict(int)
    for r in imported.ledger:
        by_phase[r["phase"]] += r["flops"]
    for phase in ("rollout", "update", "recompute"):  # TRL's default gradient checkpointing: recomputed, uncounted
        assert by_phase[phase] == sum(r["flops"] for r in ledger if r["phase"] == phase) > 0
    assert all(not r["counted"] for r in imported.ledger if r["phase"] == "recompute")


def test_logged_tokens_at_uneven_lengths_lie_between_the_unpadded_charge_and_the_padded_bound(trl_dirs, tmp_path):
    """The run with rows of their own lengths, its log stripped of the callback's keys (what
    TRL logs without it): the token charge (every row at lengths as even as the totals
    allow, unpadded) is at most what TRL executed (the callback's ledger: padded rows,
    attention convex in length) and that is at most the guard's bound of each generation
    at the longest prompt and completion."""
    from race.accounting import LoRA, PolicyCost
    from race.accounting.trl_step import TrlStepPlan, trl_batch_bound
    from race.models.refs import resolve_shape

    src = trl_dirs["ledger"]
    run = tmp_path / "uneven"
    shutil.copytree(src, run)
    for f in ("ledger.jsonl", "report_card.json", "report_card.md", "report_card.tex"):
        (run / f).unlink()
    state_path = run / f"checkpoint-{STEPS}" / "trainer_state.json"
    state = json.loads(state_path.read_text())
    state["log_history"] = [{k: v for k, v in h.items() if not k.startswith("race/")} for h in state["log_history"]]
    state_path.write_text(json.dumps(state))
    logs = [h for h in state["log_history"] if "loss" in h]
    assert any(h["completions/min_length"] < h["completions/max_length"] for h in logs)  # lengths did differ
    (imported,) = _import([run], tmp_path / "s", fields={"prompts_per_step": 2}).runs
    assert imported.flops_from == "tokens"
    executed = _ledger(src)
    plan = TrlStepPlan(per_device_train_batch_size=8, num_generations=4)
    policy = PolicyCost(resolve_shape("tiny-xs"), LoRA(2, ("q_proj", "v_proj")), "race")
    longest = max(_prompt_lengths())
    bound = trl_batch_bound(plan, policy, prompt_len=longest, completion_len=COMPLETION)
    for e in imported.evals[1:]:
        done = _counted_upto(executed, e["step"])
        assert 0 < e["flops"] < done <= e["step"] * bound  # strictly below: padding and uneven rows ran


def _prompt_lengths() -> list[int]:
    """Token lengths of the uneven run's training prompts (the char tokenizer TRL used)."""
    from race.models.tokenizer import build_char_tokenizer

    from .conftest import _problems

    tok = build_char_tokenizer()
    train, _ = _problems(one_length=False)
    return [len(tok(p.prompt)["input_ids"]) for p in train]


def test_trl_studies_read_by_race_report(trl_dirs, tmp_path):
    """A manifest of two TRL directories (one charged by the callback, one from tokens), two
    seeds of one allocation, imported by the CLI; `race report` renders it with the caveats."""
    manifest = tmp_path / "runs.csv"
    manifest.write_text(f"path,run,seed\n{trl_dirs['fixed']},with-callback,0\n{trl_dirs['plain']},tokens,1\n")
    runner = CliRunner(env={"COLUMNS": "200"})
    args = ["import", str(manifest), "--format", "trl", "--study-dir", str(tmp_path / "s"), "--eval-problems",
            str(EVAL_PROBLEMS), "--all-positions-head"]
    for k, v in TRL_FIELDS.items():
        args += ["--set", f"{k}={v}"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "imported 2 run(s), 1 allocation(s)" in res.output and "different sources" in res.output
    rep = runner.invoke(app, ["report", str(tmp_path / "s"), "--n-boot", "20", "--n-boot-fit", "10"])
    assert rep.exit_code == 0, rep.output
    md = (tmp_path / "s" / "report" / "report.md").read_text()
    assert "Imported runs (1): FLOPs counted by RACE's TRL callback" in md
    assert "Imported runs (1): FLOPs charged by RACE from the logged token counts" in md
    data = json.loads((tmp_path / "s" / "report" / "report.json").read_text())
    assert data["sections"]["summary"]["data"]["targets"] == ["pass@1"]


def test_trl_refusals_name_what_to_add(trl_dirs, tmp_path):
    from race.protocol.imports import ImportRefused

    run = trl_dirs["fixed"]
    with pytest.raises(ImportRefused, match="eval_rewards/correct/mean"):  # the keys it has, listed
        _import([run], tmp_path / "a", score_key="eval_accuracy")
    with pytest.raises(ImportRefused, match="--eval-problems"):
        _import([run], tmp_path / "b", eval_problems=None)
    with pytest.raises(ImportRefused, match="num_generations=8 but the run's report card says 4"):
        _import([run], tmp_path / "c", fields={"num_generations": 8})
    with pytest.raises(ImportRefused, match="outside \\[0, 1\\]"):  # a length is not a score
        _import([run], tmp_path / "d", score_key="completions/mean_length")
    with pytest.raises(ImportRefused, match="no trainer_state.json"):
        _import([tmp_path], tmp_path / "e")
    broken = tmp_path / "no-start"
    shutil.copytree(run, broken)
    state_path = broken / f"checkpoint-{STEPS}" / "trainer_state.json"
    state = json.loads(state_path.read_text())
    state["log_history"] = [h for h in state["log_history"] if h["step"] > 0]
    state_path.write_text(json.dumps(state))
    with pytest.raises(ImportRefused, match="eval_on_start=True"):
        _import([broken], tmp_path / "f")
    state["log_history"] = [h for h in state["log_history"] if "eval_loss" not in h]
    state_path.write_text(json.dumps(state))
    with pytest.raises(ImportRefused, match="no evaluations"):
        _import([broken], tmp_path / "g")
    with pytest.raises(ImportRefused, match="prompts_per_step x num_generations"):  # 12 rows were not logged
        _import([trl_dirs["plain"]], tmp_path / "h", fields={"prompts_per_step": 3})


def test_race_replay_reads_an_imported_trl_study(trl_dirs, tmp_path):
    """TRL output directories imported as two allocations x two seeds, read at each step's
    counted FLOPs (--budgets: each run's prefixes stand for the shorter runs): `race replay`
    replays every design on them and `race report` shows its table."""
    from race.grid import load_tables

    manifest = tmp_path / "runs.csv"
    rows = [f"{trl_dirs[d]},{d}-{lr},{seed},{lr}" for lr in ("0.001", "0.002") for d, seed in (("fixed", 0),
                                                                                              ("plain", 1))]
    manifest.write_text("path,run,seed,learning_rate\n" + "\n".join(rows) + "\n")
    fields = [a for k, v in TRL_FIELDS.items() if k != "learning_rate" for a in ("--set", f"{k}={v}")]
    runner = CliRunner(env={"COLUMNS": "200"})
    base = ["import", str(manifest), "--format", "trl", "--eval-problems", str(EVAL_PROBLEMS), "--all-positions-head",
            *fields]
    res = runner.invoke(app, [*base, "--study-dir", str(tmp_path / "probe")])
    assert res.exit_code == 0, res.output
    ev = load_tables(tmp_path / "probe")["evals"]
    levels = sorted({float(f) for f in ev["flops"] if f > 0})
    res = runner.invoke(app, [*base, "--study-dir", str(tmp_path / "s"), "--budgets", ",".join(f"{b:.17g}"
                                                                                              for b in levels)])
    assert res.exit_code == 0, res.output
    rep = runner.invoke(app, ["replay", str(tmp_path / "s"), "--json"])
    assert rep.exit_code == 0, rep.output
    out = json.loads(rep.output)
    assert out["seeds"] == [0, 1] and len(out["reads"]) == len(levels) == STEPS and "default" in out["designs"]
    assert all(r["pick"] in out["truth"] for r in out["designs"].values())
    assert runner.invoke(app, ["report", str(tmp_path / "s"), "--n-boot", "20", "--n-boot-fit", "10"]).exit_code == 0
    data = json.loads((tmp_path / "s" / "report" / "report.json").read_text())
    assert set(data["sections"]["replay"]["data"]["designs"]) == set(out["designs"])
