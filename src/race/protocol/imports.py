"""``race import``: runs trained elsewhere become a RACE study (docs/import.md).

Sources (``fmt``; told by the path when not given): a TRL output directory (one run; its
fields from ``settings``), a CSV or JSONL file of evaluations (one row each, any number of
runs: ``race.protocol.import_rows``), or, with ``fmt="trl"``, a CSV/JSONL manifest of TRL
output directories (one row each: ``path``, optional ``run``, the run's fields). FLOPs are
RACE's: the ledger of RACE's TRL callback when it was on, else the logged tokens charged by
RACE's accounting (``race.protocol.import_charge``), or, for a file that gives ``flops``,
the file's own numbers (the caveat says so).

Refused, with what to add or fix (:class:`ImportRefused`): missing columns or fields, a
score outside [0, 1], no step-0 evaluation, FLOPs that fall, an unknown model, two runs of
one allocation and seed, and an allocation with one seed unless ``allow_one_seed`` (the
report reads one seed; racing, ``race replay`` and the learning gate's paired test need
two or more). Carried as caveats, stored with the study and shown by ``race report``:
where the FLOPs came from and under which conventions, uneven evaluation points across
runs, runs that ended at different FLOPs, missing per-problem outcomes.

The study is written through the study store's API (``Store.add_external_runs``, then
``Store.ingest`` per run, as the grid writes a finished run), so ``load_tables``,
``load_study``, ``race report`` and the racing decisions read it as any study. Each run's
budget is the nominal budget its source gives, else the largest final counted FLOPs of the
study's runs: one budget, every run read at equal counted FLOPs within it. The stored grid
spec is ``{"study", "imported": {...}, "eval": {"targets": [primary target]}}``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from race.schema import ALLOCATION_COLUMNS

from .errors import ImportRefused
from .import_charge import TOKENS_NOTE, Shapes, lora_text
from .import_rows import ImportedRun, runs_from_file, same_value
from .import_trl import DEFAULT_TARGET as TRL_TARGET, read_manifest, trl_run

FORMATS = ("trl", "csv", "jsonl")
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass
class ImportResult:
    """What ``import_study`` wrote."""

    study_dir: Path
    study: str
    runs: list[ImportedRun]
    caveats: list[str]
    primary_target: str

    @property
    def allocations(self) -> int:
        return len({_key(r) for r in self.runs})


def detect_format(path: Path, fmt: str | None) -> str:
    """``fmt`` when given, else a directory = ``trl``, ``.csv``, ``.jsonl`` (or ``.json``)."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise ImportRefused(f"--format {fmt!r}: choose {', '.join(FORMATS)}")
        return fmt
    if path.is_dir():
        return "trl"
    suffix = path.suffix.lower()
    if suffix in (".csv", ".jsonl"):
        return suffix[1:]
    if suffix == ".json":
        return "jsonl"
    raise ImportRefused(f"{path}: cannot tell its format (a TRL output directory, a .csv or a .jsonl file): "
                        "pass --format trl|csv|jsonl")


def collect_runs(paths: Sequence[Path], fmt: str | None, *, settings: dict[str, Any], shapes: Shapes,
                 score_key: str | None, target: str | None, eval_problems: int | None, conventions: str,
                 compact_head: bool) -> list[ImportedRun]:
    """Every run of ``paths`` (module docstring)."""
    runs: list[ImportedRun] = []
    for p in paths:
        f = detect_format(p, fmt)
        if f in ("csv", "jsonl"):
            runs += runs_from_file(p, f, settings=settings, shapes=shapes, conventions=conventions,
                                   compact_head=compact_head)
            continue
        if not p.exists():
            raise ImportRefused(f"{p}: no such directory")
        dirs = [(p, None, {})] if p.is_dir() else read_manifest(p, detect_format(p, None))
        for d, name, values in dirs:
            both = {**settings, **values}
            for k in set(settings) & set(values):
                if not same_value(settings[k], values[k]):
                    raise ImportRefused(f"{d}: {k} is {values[k]!r} in the manifest and --set {k}={settings[k]}")
            runs.append(trl_run(d, both, name=name, shapes=shapes, score=score_key, target=target or TRL_TARGET,
                                eval_problems=eval_problems, conventions=conventions, compact_head=compact_head))
    if not runs:
        raise ImportRefused("nothing to import: give a TRL output directory, a .csv or a .jsonl file")
    return runs


def _key(run: ImportedRun) -> str:
    from race.spec.cells import allocation_label

    return allocation_label(run.fields.allocation())


def run_id(name: str) -> str:
    """A run's id in the study: its name with characters outside ``[A-Za-z0-9._-]`` as ``-``."""
    return _SAFE.sub("-", str(name)).strip("-") or "run"


def check_study(runs: list[ImportedRun], allow_one_seed: bool) -> list[str]:
    """Refuse what cannot make a study; return the soft problems as caveats (module docstring)."""
    from race.accounting.guard import overspent

    ids: dict[str, str] = {}
    for r in runs:
        rid = run_id(r.name)
        if rid in ids:
            raise ImportRefused(f"runs {ids[rid]!r} and {r.name!r} have the same id {rid!r} in the study: rename one")
        ids[rid] = r.name
    seeds: dict[str, dict[int, str]] = {}
    for r in runs:
        have = seeds.setdefault(_key(r), {})
        if r.fields.seed in have:
            raise ImportRefused(f"runs {have[r.fields.seed]!r} and {r.name!r} are both seed {r.fields.seed} of "
                                f"[{_key(r)}]: give each run its own seed (or tell their allocations apart)")
        have[r.fields.seed] = r.name
        if overspent(r.total_flops, r.budget):
            raise ImportRefused(f"run {r.name} counted {r.total_flops:.4g} FLOPs, more than its budget {r.budget:.4g}")
    single = sorted(k for k, s in seeds.items() if len(s) == 1)
    caveats = _sources(runs)
    if single and not allow_one_seed:
        raise ImportRefused(f"{len(single)} allocation(s) have one seed ({'; '.join(single[:3])}"
                            f"{' ...' if len(single) > 3 else ''}): racing, race replay and the learning gate compare "
                            "seeds, so import two or more per allocation, or pass --allow-one-seed to import them for "
                            "the report alone")
    if single:
        caveats.append(f"{len(single)} allocation(s) have one seed: the report reads them without a seed spread; "
                       "racing and race replay need two or more")
    return caveats + _soft(runs)


def _sources(runs: list[ImportedRun]) -> list[str]:
    out = []
    for (how, conv), rs in _groups(runs, lambda r: (r.flops_from, r.conventions)).items():
        what = {"ledger": f"counted by RACE's TRL callback (its ledger; conventions {conv})",
                "tokens": f"{TOKENS_NOTE}; conventions {conv}",
                "file": "as the file gives them: RACE did not count them (state their conventions beside the "
                        "results; RACE's own conventions are in docs/design.md)"}[how]
        loras = sorted({lora_text(r.lora) for r in rs}) if how == "tokens" else []
        out.append(f"Imported runs ({len(rs)}): FLOPs {what}" + (f" ({'; '.join(loras)})" if loras else "") + ".")
    if len(out) > 1:
        out.append("The runs' FLOPs come from different sources: compare allocations across them with care.")
    return out + sorted({n for r in runs for n in r.notes})


def _groups(runs: list[ImportedRun], key: Any) -> dict[Any, list[ImportedRun]]:
    out: dict[Any, list[ImportedRun]] = {}
    for r in runs:
        out.setdefault(key(r), []).append(r)
    return out


def _soft(runs: list[ImportedRun]) -> list[str]:
    out = []
    for t in sorted({e["target"] for r in runs for e in r.evals}):
        steps = {tuple(sorted(e["step"] for e in r.evals if e["target"] == t)) for r in runs
                 if any(e["target"] == t for e in r.evals)}
        if len(steps) > 1:
            counts = sorted(len(s) for s in steps)
            out.append(f"{t} evaluation points differ across runs ({len(steps)} different sets of steps, {counts[0]} "
                       f"to {counts[-1]} points per run): each run is read at equal counted FLOPs by interpolating "
                       "between its own points, and a curve is only as fine as its points.")
    totals = [r.total_flops for r in runs]
    if max(totals) > 1.05 * min(totals):
        out.append(f"The runs ended between {min(totals):.3g} and {max(totals):.3g} counted FLOPs: within a budget "
                   "every run is compared at the smallest last-evaluated FLOPs of its runs, so longer runs' ends "
                   "are read where the shortest stopped.")
    bare = [r.name for r in runs if any(e["per_problem"] is None for e in r.evals)]
    if bare:
        out.append(f"{len(bare)} of {len(runs)} runs have no per-problem outcomes: intervals resample seeds only "
                   "(not problems) and comparisons are not paired over problems.")
    return out


def primary_target(runs: list[ImportedRun], target: str | None) -> str:
    """``target`` when given, else ``greedy`` when every run has it, else the first run's first."""
    have = [{e["target"] for e in r.evals} for r in runs]
    if target is not None:
        if not all(target in h for h in have):
            raise ImportRefused(f"--target {target!r} is not evaluated in every run (targets: "
                                f"{', '.join(sorted(set().union(*have)))})")
        return target
    common = set.intersection(*have)
    return "greedy" if "greedy" in common else sorted(common)[0] if common else runs[0].evals[0]["target"]


def _run_json(r: ImportedRun, rid: str, budget: float) -> dict[str, Any]:
    return {"run_id": rid, "status": "complete", "stop_reason": "imported", "engine": r.fields.engine or "imported",
            "budget_flops": budget, "total_flops": r.total_flops, "steps": r.steps,
            "model_params": r.shape.num_params(), "non_embedding_params": r.shape.non_embedding_params(),
            "conventions": r.conventions, "imported": {"source": r.source, "flops_from": r.flops_from, "name": r.name}}


def budget_levels(runs: list[ImportedRun], levels: Sequence[float]) -> dict[str, tuple[float, list[dict[str, Any]]]]:
    """``--budgets``: run name -> (its budget: the smallest level its counted FLOPs fit, its
    budget points: per smaller level, the last step whose evaluation fits it), as a nested
    grid's run stands for its smaller budgets (``Store.ingest`` writes each point as that
    budget's run, ``prefix_of`` the run). Only at a constant learning rate is a prefix the
    shorter run: a run that says otherwise is refused."""
    from race.accounting.guard import check_budget, overspent

    for b in levels:
        check_budget(b, "--budgets")
    levels = sorted(set(float(b) for b in levels))
    out = {}
    for r in runs:
        schedule = r.fields.axes.get("lr_scheduler_type", "constant")
        if schedule != "constant" or r.budget is not None:
            drop = "its budget column" if r.budget is not None else f"lr_scheduler_type={schedule}"
            raise ImportRefused(f"run {r.name}: --budgets reads each run's prefixes as the runs of the smaller "
                                "budgets, which holds at a constant learning rate only, and each level is a budget: "
                                f"drop {drop} or --budgets")
        i = next((i for i, b in enumerate(levels) if not overspent(r.total_flops, b)), None)
        if i is None:
            raise ImportRefused(f"run {r.name} counted {r.total_flops:.4g} FLOPs, more than the largest of --budgets "
                                f"({levels[-1]:.4g}): add a level it fits")
        points = []
        for b in levels[:i]:
            inside = [e["step"] for e in r.evals if e["step"] > 0 and not overspent(e["flops"], b)]
            if inside:
                points.append({"budget": b, "step": max(inside)})
        out[r.name] = (levels[i], points)
    return out


def write_study(study_dir: Path, name: str, runs: list[ImportedRun], spec: dict[str, Any], replace: bool,
                levels: dict[str, tuple[float, list[dict[str, Any]]]] | None = None) -> None:
    """Write the study through the store's API (module docstring); ``levels``: each run's
    budget and budget points (:func:`budget_levels`)."""
    from race.grid import Store
    from race.grid.store import STORE_FILE

    store_path = study_dir / STORE_FILE
    if store_path.exists():
        with Store(study_dir, create=False) as old:
            stored = old.study_spec() or {}
        if not stored.get("imported"):
            raise ImportRefused(f"{study_dir} holds a study RACE ran (study.sqlite): pass another --study-dir")
        if not replace:
            raise ImportRefused(f"{study_dir} already holds an imported study: pass --replace to import it again "
                                "(all its sources at once), or another --study-dir")
        for suffix in ("", "-wal", "-shm"):
            Path(f"{store_path}{suffix}").unlink(missing_ok=True)
    default_budget = max(r.total_flops for r in runs)
    with Store(study_dir) as store:
        store.register_study(name, json.dumps(spec, sort_keys=True))
        rows = []
        for i, r in enumerate(runs):
            alloc = r.fields.allocation()
            rows.append({"run_id": run_id(r.name), "position": i, "allocation": alloc, "label": _key(r),
                         "spec": {"imported": {"source": r.source, "name": r.name}, **alloc, "seed": r.fields.seed},
                         "engine": r.fields.engine, "seed": r.fields.seed,
                         "budget": levels[r.name][0] if levels else r.budget or default_budget,
                         "lora_r": alloc.get("lora.r"), **{k: alloc[k] for k in ALLOCATION_COLUMNS}})
        store.add_external_runs(name, rows)
        for r, row in zip(runs, rows):
            run = {**_run_json(r, row["run_id"], row["budget"]), "budget_points": levels[r.name][1] if levels else []}
            store.ingest(row["run_id"], {"run": run, "ledger": r.ledger, "evals": r.evals, "train": r.train})


def import_study(paths: Sequence[str | Path], study_dir: str | Path, *, fmt: str | None = None,
                 settings: dict[str, Any] | None = None, models: list[str] | None = None, score_key: str | None = None,
                 target: str | None = None, eval_problems: int | None = None, conventions: str = "race",
                 compact_head: bool = True, allow_one_seed: bool = False, study: str | None = None,
                 replace: bool = False, budgets: Sequence[float] | None = None) -> ImportResult:
    """Import ``paths`` into a new study at ``study_dir`` (module docstring). ``settings``:
    fields every run shares (``--set``); ``models``: ``--model`` (``REF`` or ``NAME=REF``);
    ``score_key``/``target``/``eval_problems``: a TRL directory's score key, its target name
    (default ``pass@1``) and evaluation set size; ``conventions``: how tokens are charged;
    ``compact_head``: TRL's fused head ran at completion tokens only (Triton on CUDA) rather
    than every position (CPU); ``budgets``: budget levels, each run's prefixes written as the
    runs of the smaller levels (:func:`budget_levels`)."""
    from race.accounting.conventions import resolve
    from race.accounting import AccountingError

    try:
        resolve(conventions)
    except AccountingError as e:
        raise ImportRefused(f"--conventions: {e}") from None
    sdir = Path(study_dir)
    runs = collect_runs([Path(p) for p in paths], fmt, settings=dict(settings or {}), shapes=Shapes.parse(models),
                        score_key=score_key, target=target, eval_problems=eval_problems, conventions=conventions,
                        compact_head=compact_head)
    caveats = check_study(runs, allow_one_seed)
    levels = budget_levels(runs, budgets) if budgets else None
    if levels:
        caveats.append(f"Budgets {', '.join(f'{b:.3g}' for b in sorted(set(budgets or [])))}: each run's prefix at a "
                       "smaller budget stands for the run of that budget, as in a nested grid (true at a constant "
                       "learning rate after warmup, which RACE cannot check for runs it did not run).")
    primary = primary_target(runs, target)
    name = study or sdir.resolve().name
    spec = {"study": name, "eval": {"targets": [primary]},
            "imported": {"sources": [str(p) for p in paths], "caveats": caveats, "runs": len(runs),
                         "flops_from": sorted({r.flops_from for r in runs})}}
    write_study(sdir, name, runs, spec, replace, levels)
    return ImportResult(study_dir=sdir, study=name, runs=runs, caveats=caveats, primary_target=primary)


__all__ = ["FORMATS", "ImportRefused", "ImportResult", "budget_levels", "check_study", "collect_runs", "detect_format",
           "import_study", "primary_target", "run_id", "write_study"]
