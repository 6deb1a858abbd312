"""``build_report``: a study in, ``report.html`` + ``report.md`` (+ PNGs) + ``report.json`` out.

Sections, in order: study summary, compute report card, racing (a racing study's rungs and
target run), recommendation, validation,
frontier, compute split, feedback (reward-model quality, cost and proxy divergence),
update share (score against p, the best p per reward system, the regime),
isoFLOP profiles, learning curves, regimes and rank stability, diagnostics, FLOPs vs
seconds, how to read. The study's compute report card is also written on its own as
``report_card.{json,md,tex}``. Each section degrades on its own: a missing
ingredient (one budget, fewer than 3 sizes, no random control, failed cells, ...) turns
into a note in its place, never an exception. Only a study that cannot be read, or has no
complete pilot run, raises :class:`~race.protocol.study.ReportError`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from race.accounting.guard import is_budget
from race.analysis import prepare_runs
from race.protocol import ReportError, Study, default_target_budget, load_study

from race.cards import write_card

from .doc import Context, Section, finished, guarded
from .fmt import fmt_flops, jsonable, short_labels
from .latex import write_study_table
from .sections_feedback import feedback_section
from .sections_update_share import update_share_section
from .sections_race import race_section
from .sections_replay import replay_section
from .render import render_html, render_markdown
from .sections_decision import (
    method_section,
    recommendation_section,
    regimes_section,
    validation_section,
)
from .sections_diagnostics import diagnostics_section
from .sections_study import (
    card_section,
    curves_section,
    frontier_section,
    isoflop_section,
    seconds_section,
    split_section,
    study_card,
    summary_section,
)

DEFAULT_TARGETS = ("greedy", "pass@k", "pass@1", "hard")


@dataclass
class ReportPaths:
    """Where the report went, and its headline."""

    out_dir: Path
    html: Path
    markdown: Path
    json: Path
    figures: dict[str, Path] = field(default_factory=dict)
    headline: str | None = None
    confidence: str | None = None
    total_flops: float | None = None
    target_budget: float | None = None
    missing: dict[str, str] = field(default_factory=dict)


def _targets(evals: pd.DataFrame, wanted: Sequence[str]) -> tuple[list[str], list[str]]:
    present = list(dict.fromkeys(evals["target"].astype(str)))
    chosen = [t for t in dict.fromkeys(wanted) if t in present]
    notes = []
    # the first wanted target is the primary one (asked for); the rest are optional extras
    # (DEFAULT_TARGETS), left out silently when the study did not evaluate them
    if wanted and wanted[0] not in present:
        notes.append(f"evaluation target {wanted[0]} is not in the study's evaluations "
                     f"(present: {', '.join(present) or 'none'}); the report uses {(chosen or present or ['none'])[0]}")
    if not chosen:
        chosen = present
    return chosen, notes


def make_context(study: Study, *, target_budget: float | None, targets: Sequence[str], rng: int,
                 n_boot: int, n_boot_fit: int, count_rm_training: bool | None = None) -> Context:
    runs = study.pilot_runs
    evals = study.evals_of(runs)
    chosen, notes = _targets(evals, targets)
    if not chosen:
        raise ReportError(f"study {study.name} has no evaluation rows for its complete pilot runs")
    tb = float(target_budget) if target_budget is not None else default_target_budget(study, chosen[0])
    if not is_budget(tb):
        raise ReportError(f"target budget must be a positive number of FLOPs, got {target_budget!r}")
    prepared = prepare_runs(runs)
    keys = list(prepared["allocation"])
    if len(study.validation_runs):
        keys += list(prepare_runs(study.validation_runs, include_failed=True)["allocation"])
    return Context(study=study, target_budget=tb, targets=chosen, rng=int(rng), n_boot=int(n_boot),
                   n_boot_fit=int(n_boot_fit), labels=short_labels(keys), runs=runs, evals=evals,
                   prepared=prepared, notes=notes,
                   count_rm_training=study.count_rm_training if count_rm_training is None else bool(count_rm_training))


BUILDERS = (
    ("summary", "Study", summary_section),
    ("card", "Compute report card", card_section),
    ("race", "Racing: rungs toward the target", race_section),  # racing studies only (protocol: race)
    ("recommendation", "Recommendation", recommendation_section),
    ("replay", "What racing would have cost and picked here", replay_section),  # complete trajectories only
    ("validation", "Validation at the target budget", validation_section),
    ("frontier", "Allocation frontier", frontier_section),
    ("split", "Compute split per allocation", split_section),
    ("feedback", "Feedback: what it cost and what it bought", feedback_section),
    ("update_share", "Update share: score against p", update_share_section),
    ("isoflop", "IsoFLOP profiles", isoflop_section),
    ("curves", "Learning curves", curves_section),
    ("regimes", "Regimes and rank stability", regimes_section),
    ("diagnostics", "Diagnostics", diagnostics_section),
    ("seconds", "FLOPs and wall-clock seconds", seconds_section),
    ("method", "How to read this report", method_section),
)


def analyse(ctx: Context) -> list[Section]:
    """Every section of the report, in order (each guarded on its own; the racing section for
    racing studies only)."""
    return [guarded(key, title, lambda fn=fn: fn(ctx)) for key, title, fn in BUILDERS
            if key != "race" or ctx.study.race is not None]


def build_report(source: "str | Path | Mapping[str, pd.DataFrame] | Study", out_dir: str | Path | None = None,
                 *, target_budget: float | None = None, targets: Sequence[str] | None = None, rng: int = 0,
                 n_boot: int = 500, n_boot_fit: int = 200, count_rm_training: bool | None = None) -> ReportPaths:
    """Write ``report.html``, ``report.md`` (with ``figures/*.png``) and ``report.json``.

    ``source``: a study directory, a dict of tables (``runs``, ``evals``, optional
    ``train``, ``ledger``, ``validations``) or a loaded :class:`Study`. ``out_dir``
    defaults to ``<study_dir>/report``. ``target_budget`` defaults to the latest validated
    target budget, else 4x the largest pilot budget. ``targets[0]`` is the primary target
    (recommendation, isoFLOP, learning curves, diagnostics; default: the study's, i.e. its
    grid's first ``eval.targets`` entry, else greedy); the frontier and regimes use
    every target present. ``n_boot``: bootstrap replicates of scores; ``n_boot_fit``: of
    curve fits (the recommendation). ``count_rm_training``: count the reward models'
    training FLOPs in the report card's total (default: the grid's
    ``report.count_rm_training``, else false: a separate line outside the pilot budget).
    """
    study = source if isinstance(source, Study) else load_study(source, target_budget=target_budget)
    if targets is None:  # the study's primary target first (its grid's first eval target), then the rest
        targets = (study.primary_target, *[t for t in DEFAULT_TARGETS if t != study.primary_target])
    if out_dir is None:
        if study.study_dir is None:
            raise ReportError("out_dir is required when the study is given as tables")
        out_dir = study.study_dir / "report"
    out = Path(out_dir)
    ctx = make_context(study, target_budget=target_budget, targets=targets, rng=rng, n_boot=n_boot,
                       n_boot_fit=n_boot_fit, count_rm_training=count_rm_training)
    sections = analyse(ctx)
    figures = _write_figures(sections, out / "figures")
    rec, total = ctx.rec, ctx.total_flops
    title = f"RACE report: {study.name}"
    subtitle = (f"{len(ctx.prepared)} complete pilot runs, {ctx.prepared['allocation'].nunique()} allocations, "
                f"{ctx.prepared['budget'].nunique()} budgets"
                + (f"; study total {fmt_flops(total)}" if total is not None else "")
                + f"; target budget {fmt_flops(ctx.target_budget)}; primary target {ctx.primary}")
    generated = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    footer = f"Generated by RACE on {generated} from {study.source}."
    html_path, md_path, json_path = out / "report.html", out / "report.md", out / "report.json"
    html_path.write_text(render_html(title, subtitle, sections, footer), encoding="utf-8")
    md_path.write_text(render_markdown(title, subtitle, sections, {k: f"figures/{p.name}" for k, p in figures.items()},
                                       footer), encoding="utf-8")
    write_study_table(ctx, out)  # study_table.tex beside report.md, for a paper to \input
    if not finished(study.runs).empty:  # report_card.{json,md,tex}: the study's compute report card
        write_card(study_card(ctx), out)
    missing = {s.key: s.missing for s in sections if s.missing}
    payload = _payload(ctx, sections, figures, title, generated)
    json_path.write_text(json.dumps(jsonable(payload), indent=2, allow_nan=False), encoding="utf-8")
    return ReportPaths(out_dir=out, html=html_path, markdown=md_path, json=json_path, figures=figures,
                       headline=payload["headline"]["text"], confidence=rec.confidence if rec else None,
                       total_flops=total, target_budget=ctx.target_budget, missing=missing)


def _write_figures(sections: list[Section], fig_dir: Path) -> dict[str, Path]:
    """Every section's figures as ``fig_dir/<key>.png``: key -> path."""
    fig_dir.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Path] = {}
    for s in sections:
        for f in s.figures:
            path = fig_dir / f"{f.key}.png"
            path.write_bytes(f.png)
            figures[f.key] = path
    return figures


def _payload(ctx: Context, sections: list[Section], figures: dict[str, Path], title: str,
             generated: str) -> dict[str, Any]:
    """``report.json``: the options, the headline, every section's data and the figures' paths."""
    rec, study = ctx.rec, ctx.study
    return {
        "title": title, "study": study.name, "source": study.source, "generated": generated,
        "options": {"target_budget": ctx.target_budget, "targets": ctx.targets, "rng": ctx.rng, "n_boot": ctx.n_boot,
                    "n_boot_fit": ctx.n_boot_fit, "count_rm_training": ctx.count_rm_training},
        "headline": {"recommendation": rec.allocation if rec else None,
                     "text": next((s.data.get("headline") for s in sections if s.key == "recommendation"), None),
                     "confidence": rec.confidence if rec else None, "total_flops": ctx.total_flops},
        "sections": {s.key: {"title": s.title, "missing": s.missing, "data": s.data} for s in sections},
        "figures": {k: f"figures/{p.name}" for k, p in figures.items()},
    }


__all__ = ["build_report", "ReportPaths", "make_context", "analyse", "DEFAULT_TARGETS", "BUILDERS"]
