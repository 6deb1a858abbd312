"""The report's update-share section: score against p per reward system (figure, best p,
regime beside RACE's confidence, each allocation's p and paired difference), and the note in
its place when the study never varies p at a fixed reward."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import report_synth as rs

from race.analysis.update_share import best_shares, share_table
from race.report import build_report

BUDGETS = (1e14, 1e15)


def _p_study():
    """Two budgets; a rule line at p 0.55/0.65/0.75/0.85 peaking at 0.7 and a PRM line at p
    0.40/0.50/0.60 (feedback 0.3) falling with p; 2 seeds, 800 problems."""
    lines = {"rule": [(0.55, 0.0), (0.65, 0.0), (0.75, 0.0), (0.85, 0.0)], "prm:prm-s": [(0.4, 0.3), (0.5, 0.3),
                                                                                          (0.6, 0.3)]}
    allocs, split = [], {}
    for reward, pts in lines.items():
        for k, (p, f) in enumerate(pts, start=1):
            al = dataclasses.replace(rs.SMALL, reward=reward, num_iterations=k, r0=0.2)
            allocs.append(al)
            split[al.key] = (p, f)

    def score(al, budget, flops):
        p, f = split[al.key]
        top = 0.62 - 6 * (p - 0.7) ** 2 if not f else 0.6 - 0.8 * (p - 0.4)
        return np.full(len(flops), top)

    runs, evals = rs.make_study(allocs, budgets=BUDGETS, seeds=(0, 1), n_points=3, n_problems=800, rng=5,
                                seed_sd=0.002, truth_override=score)
    keys = [f"{r.model}|G={r.num_generations}|P={r.prompts_per_step}|it={r.num_iterations}|lr={r.learning_rate:g}"
            f"|{r.reward}" for r in runs.itertuples()]
    p = np.array([split[k][0] for k in keys])
    f = np.array([split[k][1] for k in keys])
    b = runs["budget"].to_numpy(float)
    return {"runs": runs.assign(learning_flops=p * b, feedback_flops=f * b, rollout_flops=(1 - p - f) * b),
            "evals": evals}


def test_the_section_shows_score_against_p_the_best_p_and_the_regime(tmp_path):
    tables = _p_study()
    paths = build_report(tables, tmp_path, n_boot=rs.N_BOOT, n_boot_fit=rs.N_BOOT_FIT)
    sec = json.loads(paths.json.read_text())["sections"]["update_share"]
    assert sec["missing"] is None and "update_share" in paths.figures and paths.figures["update_share"].stat().st_size
    table, boot = share_table(tables["evals"], tables["runs"], "greedy", n_boot=rs.N_BOOT, rng=0)
    want = best_shares(table, boot)
    got = sec["data"]["best"]
    assert [(b["budget"], b["reward"], b["status"], b["regime"], b["text"]) for b in got] == [
        (b.budget, b.reward, b.status, str(b.regime), b.text()) for b in want]
    prm = [b for b in got if b["reward"] == "prm:prm-s"]
    assert all(b["status"] == "edge" and b["best_p"] == 0.4 for b in prm)  # falls with p: the smallest p
    assert sec["data"]["confidence"] == paths.confidence
    md = paths.markdown.read_text()
    assert "Update share: score against p" in md and "RACE's recommendation confidence" in md
    assert "at the grid's edge" in md and "p_policy" in md
    # the model-free call in p and p_policy, as the analysis makes it (the PRM line falls with p: an edge)
    assert "Where the best p lies" in md
    assert [(b["in_p"]["call"], b["in_p_policy"]["text"]) for b in got] == [
        (str(b.in_p.call), b.in_p_policy.text()) for b in want]
    assert all(b["in_p"]["call"] == "edge-low" for b in prm) and "smallest p - best" in md
    shares = {round(r["p"], 3) for r in sec["data"]["allocations"]}
    assert shares == {0.55, 0.65, 0.75, 0.85, 0.4, 0.5, 0.6}


def test_a_study_that_never_varies_p_gets_a_note(tmp_path):
    paths = build_report(rs.sparse_study(), tmp_path, n_boot=rs.N_BOOT, n_boot_fit=rs.N_BOOT_FIT)
    sec = json.loads(paths.json.read_text())["sections"]["update_share"]
    assert sec["missing"] is not None and "sweep num_iterations or steps_per_generation" in sec["missing"]
