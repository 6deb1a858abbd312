"""build_report on synthetic studies: every figure present, the HTML self-contained, key
numbers equal to the analysis functions' own, and graceful degradation."""

from __future__ import annotations

import base64
from html import unescape
import json
import re
import struct

import pandas as pd
import pytest

import report_synth as rs
from report_synth import N_BOOT, N_BOOT_FIT
from race.analysis import realised_regret, recommend
from race.cards import fmt_flops
from race.protocol import ReportError
from race.report import build_report
from race.report.fmt import fmt_score

ALL_FIGURES = {"frontier", "compute_split", "isoflop", "learning_curves", "regime_heatmap", "flops_seconds",
               "predictions", "update_share"}
IMG = re.compile(r'<img [^>]*data-figure="([^"]+)"[^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def read(paths):
    """(HTML with entities unescaped, Markdown, JSON)."""
    return unescape(paths.html.read_text()), paths.markdown.read_text(), json.loads(paths.json.read_text())


def complete(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs["status"] == "complete"]


def test_every_figure_is_embedded_and_written(full_report):
    html, md, data = read(full_report)
    embedded = dict(IMG.findall(html))
    assert set(embedded) == ALL_FIGURES
    for key, b64 in embedded.items():
        w, h = png_size(base64.b64decode(b64))
        assert w > 200 and h > 100, key
        assert full_report.figures[key].read_bytes() == base64.b64decode(b64)
        assert f"](figures/{key}.png)" in md
    assert set(data["figures"]) == ALL_FIGURES
    assert not full_report.missing.keys() - {"validation"}


def test_html_is_self_contained(full_report):
    html = full_report.html.read_text()
    for attr in re.findall(r'(?:src|href)\s*=\s*"([^"]*)"', html):
        assert attr.startswith("data:image/png;base64,") or attr.startswith("#"), attr
    low = html.lower()
    for bad in ("<link", "@import", "url(", "http://", "https://", "<iframe", "<object", "@font-face"):
        assert bad not in low, bad
    assert "could not be computed" not in html and "could not be drawn" not in html


def test_key_numbers_match_the_analysis(full_report, full_tables):
    html, md, data = read(full_report)
    runs, evals = full_tables["runs"], full_tables["evals"]
    total = fmt_flops(rs.finished_flops(runs))
    assert f"study total {total}" in html and total in md
    rec = recommend(evals, complete(runs), "greedy", 4 * 1e16, n_boot=N_BOOT_FIT, rng=0)
    # against the known truth of the synthetic study, not only against the analysis:
    # the large model overtakes the others at large budgets and learned (gate passed)
    assert rec.allocation == rs.LARGE.key
    got = data["sections"]["recommendation"]["data"]
    assert got["recommendation"]["predicted_lo"] <= float(rs.LARGE.truth(4e16)) <= got["recommendation"]["predicted_hi"]
    gate = {g["allocation"]: g for g in got["gate"]}
    assert gate[rs.LARGE.key]["passed"] and gate[rs.LARGE.key]["gain"] > 0.3
    assert rs.RANDOM.key not in gate  # a control is never a candidate
    assert "evaluation problems" in got["resampled"] and "seeds" in got["resampled"]
    assert data["headline"]["recommendation"] == rec.allocation
    assert data["headline"]["confidence"] == rec.confidence == full_report.confidence
    for text in (html, md):
        assert rec.allocation in text and rec.confidence in text
        assert f"{rec.predicted_score:.3f}" in text and f"{rec.expected_regret:.3f}" in text
    assert f"Run {rec.allocation} at {fmt_flops(4e16)}" in full_report.headline
    # how close the pilots must run for a narrower interval: the analysis's advice, in words, in both formats
    from race.analysis.pilot_reach import advice_text
    assert got["recommendation"]["pilot_advice"]["status"] == rec.pilot_advice["status"]
    said = advice_text(rec.pilot_advice, fmt_flops)
    assert "narrower interval" in html and "narrower interval" in md and said.split(" (")[0] in md
    # the report card: sums over finished runs, split by axis
    card = data["sections"]["card"]["data"]["report_card"]
    done = runs[runs["status"] == "complete"]
    assert card["split"]["search"] == pytest.approx(done["rollout_flops"].sum(), rel=1e-9)
    assert card["split"]["learning"] == pytest.approx(done["learning_flops"].sum(), rel=1e-9)
    assert card["split"]["feedback"] == pytest.approx(done["feedback_flops"].sum(), rel=1e-9)
    assert "70.0%" in html  # search share of every synthetic run


def test_sections_and_diagnostics(full_report, full_tables):
    html, md, data = read(full_report)
    titles = re.findall(r"<h2>([^<]+)</h2>", html)
    assert titles[:3] == ["Study", "Compute report card", f"Recommendation for {fmt_flops(4e16)}"]
    assert {"Allocation frontier", "Regimes and rank stability", "Diagnostics", "FLOPs and wall-clock seconds"} <= set(titles)
    # the failed cell is listed with its error
    assert "failed-l-1e+14" in html and "CUDA out of memory (planted)" in html
    # the PRM allocation over-optimises: all its runs are flagged (a saturated rule run may be, by noise)
    oo = pd.DataFrame(data["sections"]["diagnostics"]["data"]["overoptimisation"])
    assert oo.loc[oo["reward"] == "prm:prm-s", "overoptimised"].all()
    assert oo.loc[oo["reward"] != "prm:prm-s", "overoptimised"].mean() < 0.2
    assert "over-optimise the reward" in html
    # a random control exists, and real allocations beat it
    rc = pd.DataFrame(data["sections"]["diagnostics"]["data"]["random_control"])
    assert len(rc) and rc["beats_control"].any()
    assert "no random-reward control" not in html
    # regimes carry win probabilities, rank stability Kendall tau and PDA, for both targets
    reg = pd.DataFrame(data["sections"]["regimes"]["data"]["regimes"])
    assert set(reg["target"]) == {"greedy", "pass@k"} and reg["win_prob"].between(0, 1).all()
    assert "Kendall tau" in html and "pairwise decision accuracy" in html
    assert "not in the study's evaluations" not in html  # an optional target the study lacks: silent
    from race.report.build import _targets

    ev = pd.DataFrame({"target": ["greedy", "pass@k"]})
    assert _targets(ev, ("greedy", "pass@k", "hard")) == (["greedy", "pass@k"], [])
    chosen, notes = _targets(ev, ("hard", "greedy"))  # the primary target asked for is missing: said
    assert chosen == ["greedy"] and notes and "evaluation target hard is not in" in notes[0]
    # isoFLOP edge warning text is shown
    iso = data["sections"]["isoflop"]["data"]["table"]
    warns = [r["warnings"] for r in iso if r["warnings"] and r["n_sizes"] >= 3]
    assert warns and all(w in unescape(html) for w in warns)
    assert "prm: only 1 model size(s) at 3 budget(s)" in html


def test_markdown_tables_escape_allocation_pipes(full_report):
    md = full_report.markdown.read_text()
    table_lines = [ln for ln in md.splitlines() if ln.startswith("| ") and "G=8" in ln]
    # an allocation key's pipes are escaped wherever a key is printed (a short label has none)
    assert any("\\|G=8\\|" in ln for ln in table_lines)
    assert not [ln for ln in table_lines if re.search(r"[^\\\s]\|G=8", ln)]


def test_sparse_study_degrades_with_notes(tmp_path):
    paths = build_report(rs.sparse_study(), tmp_path, n_boot=N_BOOT, n_boot_fit=N_BOOT_FIT)
    html, md, data = read(paths)
    assert "needs >= 3 model sizes" in paths.missing["isoflop"]
    assert "no wall-clock seconds" in paths.missing["seconds"]
    assert paths.missing["validation"].startswith("not validated yet")
    for text in ("only one budget", "rank stability needs >= 2 budgets", "no random-reward control",
                 "over-optimisation not checked", "failed-m-1e+15"):
        assert text in html, text
        assert text in md, text
    assert "could not be computed" not in html
    assert set(dict(IMG.findall(html))) == {"frontier", "compute_split", "learning_curves", "regime_heatmap",
                                            "predictions"}
    assert data["headline"]["confidence"] in ("stable regime", "unstable", "extrapolation too far")


def test_single_allocation_study_renders(tmp_path):
    runs, evals = rs.make_study([rs.MEDIUM], budgets=[1e14, 1e15], seeds=(0,), n_points=4, n_problems=50)
    paths = build_report({"runs": runs, "evals": evals}, tmp_path, n_boot=N_BOOT, n_boot_fit=N_BOOT_FIT)
    html = paths.html.read_text()
    assert "could not be computed" not in html
    assert "only one allocation" in html and rs.MEDIUM.key in html
    assert paths.confidence is not None


def test_validation_runs_in_tables_give_realised_regret(tmp_path):
    allocs = [rs.SMALL, rs.MEDIUM, rs.LARGE]
    runs, evals = rs.make_study(allocs, budgets=[1e14, 1e15, 1e16], seeds=(0, 1), n_points=5, n_problems=100)
    vruns, vevals = rs.make_study(allocs, budgets=[1e17], seeds=(0, 1), n_points=5, n_problems=100, rng=7)
    tables = {"runs": pd.concat([runs, vruns], ignore_index=True), "evals": pd.concat([evals, vevals], ignore_index=True)}
    paths = build_report(tables, tmp_path, target_budget=1e17, n_boot=N_BOOT, n_boot_fit=N_BOOT_FIT)
    html, md, data = read(paths)
    assert "validation" not in paths.missing
    rec = recommend(evals, runs, "greedy", 1e17, n_boot=N_BOOT_FIT, rng=0)
    expect = realised_regret(rec, vevals, vruns, n_boot=N_BOOT, rng=0)
    got = data["sections"]["validation"]["data"]["validation"]
    assert got["allocation"] == rec.allocation and got["realised_regret"] == pytest.approx(expect.realised_regret)
    assert f"Realised regret {fmt_score(expect.realised_regret)}" in html
    assert "treated as validation runs" in html
    # validation runs are not pilot runs: the pilot grid still has 3 budgets
    assert data["sections"]["summary"]["data"]["budgets"] == [1e14, 1e15, 1e16]
    assert "realised at the target budget" not in html or "predictions" in paths.figures


def test_errors_are_clear(tmp_path):
    with pytest.raises(ReportError, match="no such study directory"):
        build_report(tmp_path / "nope", tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match="no study store"):
        build_report(tmp_path / "empty")
    runs, evals = rs.make_study([rs.MEDIUM], budgets=[1e14], seeds=(0,), n_points=3, n_problems=0)
    with pytest.raises(ReportError, match="no complete pilot runs"):
        build_report({"runs": runs.assign(status="failed"), "evals": evals}, tmp_path / "out")
    with pytest.raises(ReportError, match="out_dir is required"):
        build_report({"runs": runs, "evals": evals})
    with pytest.raises(ReportError, match="positive"):
        build_report({"runs": runs, "evals": evals}, tmp_path / "out", target_budget=-1.0)


def test_the_recommendation_is_made_once_whichever_section_asks_first(full_tables):
    """The report's context owns the recommendation: a section that runs before the
    recommendation section (here the validation) sees it, every section shares one object,
    and a failed recommendation fails once and is None for every reader."""
    import dataclasses

    from race.protocol import load_study
    from race.report.build import DEFAULT_TARGETS, make_context
    from race.report.sections_decision import recommendation_section, validation_result

    ctx = make_context(load_study(full_tables), target_budget=None, targets=DEFAULT_TARGETS, rng=0, n_boot=N_BOOT,
                       n_boot_fit=N_BOOT_FIT)
    assert "rec" not in ctx.cache
    validation_result(ctx)
    rec = ctx.rec
    assert rec is not None and rec is ctx.recommendation[0]
    expected = recommend(ctx.evals, ctx.runs, ctx.primary, ctx.target_budget, n_boot=N_BOOT_FIT, rng=0)
    assert rec.allocation == expected.allocation and rec.predicted_score == expected.predicted_score
    sec = recommendation_section(ctx)
    assert sec.data["recommendation"]["allocation"] == rec.allocation and ctx.recommendation[0] is rec

    # the study the context reads (Study.recommendation), with no evaluations
    broken = dataclasses.replace(ctx, study=load_study({**full_tables, "evals": full_tables["evals"].iloc[:0]}),
                                 cache={})
    assert broken.rec is None
    err = broken.cache["rec"]
    with pytest.raises(type(err)):
        broken.recommendation
    assert broken.cache["rec"] is err  # not recomputed
