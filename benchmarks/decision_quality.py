"""How good are RACE's calls? The analysis on known worlds, tuned on one generator, tested on another.

    python benchmarks/decision_quality.py --generator tune --first 1000 --worlds 300   # the tuning set
    python benchmarks/decision_quality.py --generator test --worlds 1000                # the test set
    python benchmarks/decision_quality.py --path grid --worlds 20 --jobs 1 --keep /tmp/dq  # grid + report
    python benchmarks/decision_quality.py --check-paths 4                               # both paths agree?

Two generators of known worlds:

- ``tune``: :func:`race.analysis.synthetic.random_world` (sigmoid / power / log-linear /
  Weibull / rise-then-decline / flat curves, logit seed offsets). The rules in
  ``race.analysis.recommend.ConfidenceRules`` were set on its seeds 1000+ only.
- ``test``: :func:`race.analysis.synthetic_rl.rl_world`, written separately and never used
  for tuning: step-0 format jumps, an end-of-schedule bonus, seed spread growing with
  compute (0.5-6 points), collapses, rise-then-decline starting before or after the pilots,
  crossovers within the pilots / after the last pilot / beyond the target, 200-1,000 shared
  problems, 15% null worlds.

Two paths: ``fast`` (default) builds the world's runs/evals tables and calls
``race.analysis.recommend`` exactly as the report does; ``grid`` runs the real grid (local
runner, the cell function below writes run directories in the documented run format) and
the real report, and reads the call from ``report.json``. ``--check-paths N`` runs both on
N worlds and checks that they pick the same allocation with the same label.

``--design`` (fast path only) changes how the pilots are run on the same worlds
(``race.analysis.synthetic.world_tables``): ``flat`` (default; every budget x seed an
independent run), ``flat-trajectory`` (a seed's runs at every budget are one trajectory, as
a real grid at a constant learning rate runs them), ``nested`` (one run per allocation and
seed at the largest budget, read at its prefixes, rows as the grid store writes them),
``nested-equal-compute`` (nested with the seeds a flat design's compute buys),
``nested-dense`` (nested read at 6 budget points) and the diagnostic ``nested-split``;
``--n-points`` sets the evaluation points per run. ``benchmarks/design_information.py``
compares saved records of several designs, paired (docs/analysis.md, "Nested designs").
``--pilot-ratio R`` (fast path only) moves every world's pilots so that the target is R x
the largest (``race.analysis.synthetic.move_pilots``: the same curves, seeds and target),
to measure the intervals at other distances from the target than the generators' 4-16x.

The table: mean regret of RACE and of naive rules (the observed winner at the largest pilot
at equal counted FLOPs, largest model, largest group, smallest model) with the paired 95%
world-bootstrap interval of each difference, and a ceiling that is not a rule: per world the
truly better of the observed winner and the highest point forecast (no decision that
chooses between those two, by any threshold, can do better); the same for worlds whose crossover falls
after the last pilot; the chosen allocation's 95% interval (coverage with a Wilson
interval, median width, Winkler score, share of upper bounds at 1.0 and whether the
report said the curve is open above); P(best) Brier against always-1/k; label accuracy
with Wilson bounds; the gate's false-pass rate in null worlds by seed SD and seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
MODEL_NAMES = {"small": "tiny-xs", "large": "tiny-s"}  # real tiny shapes, so the grid plan can price the cells
RIGHT = 0.01


# ---------------------------------------------------------------- the cell function (runs in grid workers)
def run_cell(cfg, run_dir):
    """Grid cell function: this world's outcomes for (model, num_generations, budget, seed)."""
    run_dir = Path(run_dir)
    world = world_from_dict(json.loads((run_dir.parents[1] / "world.json").read_text()))
    k = world.index(cfg.model, cfg.num_generations)
    points = world.run_outcomes(k, cfg.budget_flops, cfg.seed)
    with (run_dir / "metrics.jsonl").open("w") as f:
        for step, (c, per) in enumerate(points):
            f.write(json.dumps({"kind": "eval", "step": step * 10, "flops": c, "target": "greedy",
                                "score": float(per.mean()), "n": len(per), "per_problem": per.tolist()}) + "\n")
    total = points[-1][0]
    (run_dir / "ledger.jsonl").write_text(json.dumps({"step": 10 * (len(points) - 1), "phase": "update",
                                                      "component": "synthetic", "flops": total, "tokens": 0,
                                                      "seconds": 0.0, "counted": True}) + "\n")
    run = {"run_id": cfg.run_id(), "name": cfg.name, "engine": "synthetic", "status": "complete",
           "stop_reason": "budget", "budget_flops": cfg.budget_flops, "total_flops": total,
           "phase_flops": {"rollout": 0.7 * total, "update": 0.3 * total}, "steps": 10 * (len(points) - 1),
           "wall_s": 0.0, "phase_seconds": {}, "model_params": world.models[cfg.model],
           "final": {"greedy": float(points[-1][1].mean())}, "initial": {"greedy": float(points[0][1].mean())},
           "diagnostics": {"zero_var_frac": 0.1, "trunc_rate": 0.0}, "config": cfg.model_dump(mode="json")}
    (run_dir / "run.json").write_text(json.dumps(run))
    return run


# ---------------------------------------------------------------- worlds
GENERATORS = ("tune", "test")


def make_world(generator: str, seed: int):
    """The tuning generator (``race.analysis.synthetic.random_world``) or the independent test
    generator (``race.analysis.synthetic_rl.rl_world``)."""
    if generator == "tune":
        from race.analysis.synthetic import random_world
        return random_world(seed)
    if generator == "test":
        from race.analysis.synthetic_rl import rl_world
        return rl_world(seed)
    raise ValueError(f"generator must be one of {GENERATORS}, got {generator!r}")


def world_from_dict(d: dict):
    from race.analysis.synthetic import World
    from race.analysis.synthetic_rl import RLWorld
    return (RLWorld if d.get("generator") == "rl" else World).from_dict(d)


def short(allocation: str) -> str:
    return "|".join(allocation.split("|")[:2])


def result_of(w, rec: dict, seconds: dict, failed: int = 0, design: str = "flat", n_seeds: int | None = None) -> dict:
    """One world's record: truth, RACE's call (from the recommendation as a dict) and the gate."""
    from race.analysis.synthetic import design_compute

    truth = {f"{a['model']}|G={a['num_generations']}": w.truth(k) for k, a in enumerate(w.allocations)}
    preds = [{"allocation": short(p["allocation"]), "score": p["score"], "lo": p["lo"], "hi": p["hi"],
              "p_best": p["p_best"], "open_above": bool(p.get("open_above") or False),
              "open_below": bool(p.get("open_below") or False),
              "truth": truth[short(p["allocation"])]} for p in rec["predictions"]]
    gate = rec["gate"]
    return {"seed": w.seed, "tags": w.tags, "truth": truth, "chosen": short(rec["allocation"]),
            "confidence": rec["confidence"], "predictions": preds,
            "observed": {short(g["allocation"]): g["end"] for g in gate},
            "gate_passed": {short(g["allocation"]): bool(g["passed"]) for g in gate},
            "n_seeds": len(w.seeds) if n_seeds is None else n_seeds, "failed": failed, "seconds": seconds,
            "design": design, "n_points": w.n_points, "pilot_compute": design_compute(w, design),
            "params": {f"{a['model']}|G={a['num_generations']}": (w.models[a["model"]], a["num_generations"])
                       for a in w.allocations}}


# ---------------------------------------------------------------- one world, fast path: the analysis on the tables
def fast_world(generator: str, seed: int, n_boot: int = 200, method: str = "joint", design: str = "flat",
               n_points: int | None = None, pilot_ratio: float | None = None) -> dict:
    """``race.analysis.recommend`` on the world's run/eval tables (what the report calls), no grid.
    ``design``: the pilot design (``race.analysis.synthetic.world_tables``); ``n_points``:
    evaluation points per run (default: the world's, 3); ``pilot_ratio``: pilots moved so that
    the target is this many times the largest (``race.analysis.synthetic.move_pilots``)."""
    from race.analysis import recommend
    from race.analysis.synthetic import move_pilots, world_tables

    w = make_world(generator, seed)
    if pilot_ratio is not None:
        w = move_pilots(w, pilot_ratio)
    if n_points is not None:
        w.n_points = int(n_points)
    t0 = time.perf_counter()
    runs, evals = world_tables(w, design)
    rec = recommend(evals, runs, "greedy", w.target_budget, n_boot=n_boot, rng=0, method=method).to_dict()
    return result_of(w, rec, {"grid": 0.0, "report": time.perf_counter() - t0}, design=design,
                     n_seeds=int(runs.loc[runs["budget"] == runs["budget"].max(), "seed"].nunique()))


# ---------------------------------------------------------------- one world through the pipeline (grid + report)
def grid_of(world, n_problems: int) -> dict:
    return {"study": world.name, "budgets": world.budgets, "require_budget_span": False,
            "base": {"prompts_per_step": 4, "max_prompt_length": 16, "max_completion_length": 16,
                     "learning_rate": 1e-4, "reward": "rule",
                     "eval": {"n_problems": n_problems, "targets": ["greedy"], "num_points": world.n_points}},
            "axes": {"model": sorted(world.models), "num_generations": [4, 8]}, "seeds": world.seeds,
            "min_steps": 0, "max_retries": 0, "cell_fn": f"{HERE}:run_cell",
            "runner": {"kind": "local", "workers": 1, "threads_per_worker": 1, "preload_torch": False}}


def run_world(seed: int, root: Path, n_boot_fit: int, generator: str = "tune") -> dict:
    """The real grid (local runner, :func:`run_cell`) and the real report; the call read from report.json."""
    from race.grid import run_grid
    from race.report import build_report

    w = make_world(generator, seed)
    w.models = {MODEL_NAMES[m]: p for m, p in w.models.items()}
    for a in w.allocations:
        a["model"] = MODEL_NAMES[a["model"]]
    study = root / w.name
    study.mkdir(parents=True, exist_ok=True)
    (study / "world.json").write_text(json.dumps(w.to_dict()))
    t0 = time.perf_counter()
    res = run_grid(grid_of(w, w.n_problems), study)
    t_grid = time.perf_counter() - t0
    paths = build_report(study, target_budget=w.target_budget, targets=("greedy",), n_boot=200,
                         n_boot_fit=n_boot_fit)
    t_report = time.perf_counter() - t0 - t_grid
    rec = json.loads(paths.json.read_text())["sections"]["recommendation"]["data"]["recommendation"]
    return result_of(w, rec, {"grid": t_grid, "report": t_report}, failed=len(res.failed))


# ---------------------------------------------------------------- scoring
def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion k / n."""
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return float(mid - half), float(mid + half)


def paired_interval(d: np.ndarray, n_boot: int = 4000, seed: int = 0) -> tuple[float, float]:
    """95% world-bootstrap percentile interval of mean(d) (d: per-world paired differences)."""
    if len(d) == 0:
        return float("nan"), float("nan")
    idx = np.random.default_rng(seed).integers(0, len(d), size=(n_boot, len(d)))
    m = d[idx].mean(axis=1)
    return float(np.quantile(m, 0.025)), float(np.quantile(m, 0.975))


def naive_picks(r: dict) -> dict[str, str]:
    obs, params = r["observed"], r["params"]

    def best_of(keys):
        return max(keys, key=lambda k: (obs.get(k, -1.0), k))

    largest = max(p[0] for p in params.values())
    smallest = min(p[0] for p in params.values())
    biggest_g = max(p[1] for p in params.values())
    return {"RACE": r["chosen"],
            "observed winner at largest pilot": best_of(list(params)),
            "largest model": best_of([k for k, p in params.items() if p[0] == largest]),
            "largest group": best_of([k for k, p in params.items() if p[1] == biggest_g]),
            "most steps (smallest model)": best_of([k for k, p in params.items() if p[0] == smallest]),
            HINDSIGHT: hindsight_pick(r, best_of(list(params))),
            "oracle": max(r["truth"], key=lambda k: r["truth"][k])}


HINDSIGHT = "hindsight: better of observed winner and highest forecast"


def hindsight_pick(r: dict, observed: str) -> str:
    """Not a rule, a ceiling: of the observed winner and the allocation with the highest point
    forecast, the one that is truly better at the target. Every decision that chooses between
    the two (switch or keep, by any threshold) has at least this regret."""
    scores = {p["allocation"]: p["score"] for p in r["predictions"]}
    top = max(scores, key=lambda k: (scores[k], k)) if scores else observed
    return top if r["truth"][top] > r["truth"][observed] else observed


def regret(r: dict, pick: str) -> float:
    return max(r["truth"].values()) - r["truth"][pick]


def _regret_table(worlds: list[dict], out: list[str], title: str) -> None:
    out.append(f"| {title} (n={len(worlds)}) | mean regret | median | right (<= {RIGHT}) | RACE - rule [95% paired] |")
    out.append("|---|---:|---:|---:|---:|")
    if not worlds:
        return
    race = np.array([regret(r, r["chosen"]) for r in worlds])
    for rule in naive_picks(worlds[0]):
        reg = np.array([regret(r, naive_picks(r)[rule]) for r in worlds])
        d = race - reg
        lo, hi = paired_interval(d)
        diff = "" if rule == "RACE" else f"{d.mean():+.4f} [{lo:+.4f}, {hi:+.4f}]"
        out.append(f"| {rule} | {reg.mean():.4f} | {np.median(reg):.4f} | {np.mean(reg <= RIGHT):.1%} | {diff} |")


def summarise(results: list[dict]) -> str:
    from race.analysis import Label

    out = []
    learn = [r for r in results if not r["tags"]["flat"]]
    flat = [r for r in results if r["tags"]["flat"]]
    made = [r for r in results if r["confidence"] != Label.NO_LEARNING]
    out.append(f"worlds: {len(results)} (null {len(flat)}, learning {len(learn)}); failed cells: "
               f"{sum(r['failed'] for r in results)}")
    out.append("")
    _regret_table(learn, out, "rule, learning worlds")
    out.append("(regret: true best minus true score of the pick at the target; paired interval: world bootstrap)")
    out.append("")
    late = [r for r in learn if r["tags"].get("crossover") == "after"]
    if late:
        _regret_table(late, out, "crossover after the last pilot")
        ra = np.mean([regret(r, r["chosen"]) for r in late])
        ro = np.mean([regret(r, naive_picks(r)["observed winner at largest pilot"]) for r in late])
        out.append(f"RACE / observed winner in these worlds: {ra / ro if ro > 0 else float('nan'):.2f} (done-when: <= 0.5)")
        out.append("")
    switched = [r for r in learn if r["chosen"] != naive_picks(r)["observed winner at largest pilot"]]
    helped = sum(regret(r, r["chosen"]) < regret(r, naive_picks(r)["observed winner at largest pilot"]) - 1e-12
                 for r in switched)
    hurt = sum(regret(r, r["chosen"]) > regret(r, naive_picks(r)["observed winner at largest pilot"]) + 1e-12
               for r in switched)
    out.append(f"switches away from the observed winner: {len(switched)} of {len(learn)} learning worlds "
               f"({helped} help, {hurt} hurt)")
    out.append("")
    # the chosen allocation's interval
    ch = [(r, p) for r in made for p in r["predictions"] if p["allocation"] == r["chosen"]]
    if ch:
        y = np.array([p["truth"] for _, p in ch])
        lo = np.array([p["lo"] for _, p in ch])
        hi = np.array([p["hi"] for _, p in ch])
        cov = (lo <= y) & (y <= hi)
        k, n = int(cov.sum()), len(cov)
        wl = wilson(k, n)
        wink = (hi - lo) + 40 * np.maximum(lo - y, 0) + 40 * np.maximum(y - hi, 0)
        at1 = hi >= 0.999
        said = np.array([p["open_above"] for _, p in ch])
        out.append("| chosen allocation's 95% interval | value |")
        out.append("|---|---:|")
        out.append(f"| coverage | {cov.mean():.1%} ({k}/{n}, Wilson [{wl[0]:.3f}, {wl[1]:.3f}]) |")
        out.append(f"| truth below / above the interval | {np.mean(y < lo):.1%} / {np.mean(y > hi):.1%} |")
        out.append(f"| median width | {np.median(hi - lo):.3f} |")
        out.append(f"| mean Winkler interval score (alpha 0.05) | {wink.mean():.3f} |")
        out.append(f"| upper bound at 1.0 | {at1.mean():.1%} (of which flagged 'open above': {said[at1].mean() if at1.any() else float('nan'):.0%}) |")
        at0, said0 = lo <= 0.001, np.array([p["open_below"] for _, p in ch])
        out.append(f"| lower bound at 0.0 | {at0.mean():.1%} (of which flagged 'open below': {said0[at0].mean() if at0.any() else float('nan'):.0%}) |")
        out.append(f"| flagged 'open above' / 'open below' (chosen) | {said.mean():.1%} / {said0.mean():.1%} |")
        allp = [(r, p) for r in made for p in r["predictions"]]
        ya = np.array([p["truth"] for _, p in allp])
        cova = np.array([p["lo"] <= p["truth"] <= p["hi"] for _, p in allp])
        out.append(f"| coverage, every forecast allocation | {cova.mean():.1%} of {len(ya)} |")
        out.append("")
    # P(best)
    fc = [(r, p) for r in made if not r["tags"]["flat"] for p in r["predictions"]]
    if fc:
        pb = np.array([p["p_best"] for _, p in fc])
        best = np.array([p["truth"] >= max(r["truth"].values()) - 1e-12 for r, p in fc])
        base = np.array([1.0 / len(r["predictions"]) for r, _ in fc])
        out.append(f"P(best) Brier score: {np.mean((pb - best) ** 2):.3f} (always 1/k: {np.mean((base - best) ** 2):.3f})")
        out.append("")
    # labels
    out.append("| label | calls | right (regret <= 0.01) | Wilson 95% | mean regret |")
    out.append("|---|---:|---:|---:|---:|")
    for lab in Label:
        rs = [r for r in learn if r["confidence"] == lab]
        if rs:
            right = int(sum(regret(r, r["chosen"]) <= RIGHT for r in rs))
            wl = wilson(right, len(rs))
            out.append(f"| {lab} (learning worlds) | {len(rs)} | {right / len(rs):.1%} | [{wl[0]:.3f}, {wl[1]:.3f}] | "
                       f"{np.mean([regret(r, r['chosen']) for r in rs]):.4f} |")
    if flat:
        k = int(sum(r["confidence"] == Label.NO_LEARNING for r in flat))
        wl = wilson(k, len(flat))
        out.append(f"| null worlds labelled 'no learning detected' | {len(flat)} | {k / len(flat):.1%} | "
                   f"[{wl[0]:.3f}, {wl[1]:.3f}] | |")
    if learn:
        k = int(sum(r["confidence"] == Label.NO_LEARNING for r in learn))
        out.append(f"| learning worlds labelled 'no learning detected' | {len(learn)} | {k / len(learn):.1%} | | |")
    out.append("")
    # gate level on null worlds, by seed SD
    if flat:
        out.append("| null worlds: gate false passes | worlds | any allocation passes | Wilson 95% | allocations passed |")
        out.append("|---|---:|---:|---:|---:|")
        sd = np.array([r["tags"].get("seed_sd_points", np.nan) for r in flat])
        buckets = [("all", np.ones(len(flat), bool))]
        if np.isfinite(sd).any():
            buckets += [(f"seed SD {a}-{b} points, {s} seeds", (sd >= a) & (sd < b) & (np.array([r["n_seeds"] for r in flat]) == s))
                        for a, b in ((0, 2), (2, 4), (4, 6.01)) for s in (2, 3)]
        for name, m in buckets:
            rs = [r for r, keep in zip(flat, m) if keep]
            if rs:
                k = int(sum(any(r["gate_passed"].values()) for r in rs))
                wl = wilson(k, len(rs))
                per = np.mean([v for r in rs for v in r["gate_passed"].values()])
                out.append(f"| {name} | {len(rs)} | {k / len(rs):.1%} | [{wl[0]:.3f}, {wl[1]:.3f}] | {per:.1%} |")
        out.append("")
    sec = np.array([[r["seconds"]["grid"], r["seconds"]["report"]] for r in results])
    out.append(f"seconds per world (median): grid {np.median(sec[:, 0]):.2f}, analysis/report {np.median(sec[:, 1]):.2f}")
    return "\n".join(out)


def one(args: argparse.Namespace, seed: int, root: Path) -> dict:
    if args.path == "grid":
        return run_world(seed, root, args.n_boot_fit, args.generator)
    return fast_world(args.generator, seed, n_boot=args.n_boot, method=args.method, design=args.design,
                      n_points=args.n_points, pilot_ratio=args.pilot_ratio)


def shard(args: argparse.Namespace) -> None:
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="race-dq-"))
    results = []
    for seed in range(args.first + args.shard, args.first + args.worlds, args.jobs):
        results.append(one(args, seed, root))
        Path(args.out).write_text(json.dumps(results))  # after every world: a long run can be inspected


def check_paths(n: int, generator: str, first: int) -> int:
    """Both paths on ``n`` worlds: same pick and label? Prints one line per world; returns mismatches."""
    bad = 0
    with tempfile.TemporaryDirectory(prefix="race-dq-") as tmp:
        for seed in range(first, first + n):
            g = run_world(seed, Path(tmp), n_boot_fit=200, generator=generator)
            f = fast_world(generator, seed)
            gm = g["chosen"].replace(MODEL_NAMES["small"], "small").replace(MODEL_NAMES["large"], "large")
            same = gm == f["chosen"] and g["confidence"] == f["confidence"]
            bad += not same
            print(f"world {seed}: grid+report {gm} ({g['confidence']}) | fast {f['chosen']} ({f['confidence']}) "
                  f"-> {'same' if same else 'DIFFERENT'}")
    return bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", type=int, default=1000)
    ap.add_argument("--first", type=int, default=0, help="first world seed (the rules were set on tune seeds 1000+)")
    ap.add_argument("--generator", choices=GENERATORS, default="test")
    ap.add_argument("--path", choices=("fast", "grid"), default="fast")
    ap.add_argument("--jobs", type=int, default=2, help="processes, each running its share of the worlds")
    ap.add_argument("--n-boot", type=int, default=200, help="joint replicates of the recommendation (fast path)")
    ap.add_argument("--n-boot-fit", type=int, default=200)
    ap.add_argument("--method", default="joint", help="recommend(method=...) on the fast path: joint, curve or trend")
    ap.add_argument("--design", choices=("flat", "nested", "nested-equal-compute", "nested-split", "flat-trajectory", "nested-dense"),
                    default="flat",
                    help="pilot design (fast path only): flat = every budget x seed its own run; nested = one run "
                    "per allocation and seed at the largest budget read at its prefixes; nested-equal-compute = "
                    "nested with the seeds a flat design's compute buys; nested-split = nested with each trajectory point "
                    "in one row only (a diagnostic of how the analysis weighs repeated prefix points); flat-trajectory = flat "
                    "as a real grid at a constant learning rate runs it (a seed's runs at every budget are one trajectory); "
                    "nested-dense = nested read at 6 log-spaced budget points (more back-test origins, same compute)")
    ap.add_argument("--n-points", type=int, default=None, help="evaluation points per run (fast path; default 3)")
    ap.add_argument("--pilot-ratio", type=float, default=None,
                    help="move every world's pilots so that the target is this many times the largest pilot "
                    "(fast path; default: the world's own, 4-16x): how calibrated the intervals are by reach")
    ap.add_argument("--save", help="also write the per-world records (JSON) here")
    ap.add_argument("--check-paths", type=int, default=0, help="run both paths on this many worlds and compare")
    ap.add_argument("--keep", help="keep the study directories here (grid path; default: a temporary directory)")
    ap.add_argument("--shard", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.pilot_ratio is not None and not args.pilot_ratio >= 1:
        ap.error(f"--pilot-ratio must be >= 1 (the target at or beyond the largest pilot), got {args.pilot_ratio}")
    if (args.path == "grid" or args.check_paths) and (args.design != "flat" or args.n_points is not None
                                                      or args.pilot_ratio is not None):
        ap.error(f"--design {args.design} / --n-points / --pilot-ratio are implemented on the fast path only: the grid path's cell "
                 "function runs one flat cell per budget; use --path fast (or --design flat without --n-points)")
    if args.check_paths:
        sys.exit(1 if check_paths(args.check_paths, args.generator, args.first) else 0)
    if args.shard is not None:
        return shard(args)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="race-dq-") as tmp:
        procs, outs = [], []
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        for i in range(args.jobs):
            out = Path(tmp) / f"shard{i}.json"
            outs.append(out)
            cmd = [sys.executable, str(HERE), "--worlds", str(args.worlds), "--first", str(args.first), "--jobs",
                   str(args.jobs), "--shard", str(i), "--out", str(out), "--n-boot-fit", str(args.n_boot_fit),
                   "--n-boot", str(args.n_boot), "--generator", args.generator, "--path", args.path,
                   "--method", args.method, "--design", args.design]
            if args.n_points is not None:
                cmd += ["--n-points", str(args.n_points)]
            if args.pilot_ratio is not None:
                cmd += ["--pilot-ratio", repr(args.pilot_ratio)]
            if args.keep:
                cmd += ["--keep", args.keep]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL))
        codes = [p.wait() for p in procs]
        if any(codes):
            sys.exit(f"a shard failed (exit codes {codes})")
        results = [r for o in outs for r in json.loads(o.read_text())]
    results.sort(key=lambda r: r["seed"])
    print(f"# RACE decision quality: {len(results)} {args.generator}-generator worlds, seeds {args.first}.."
          f"{args.first + args.worlds - 1}, {args.path} path")
    print(f"# command: python benchmarks/decision_quality.py --generator {args.generator} --worlds {args.worlds} "
          f"--first {args.first} --jobs {args.jobs} --path {args.path} --n-boot {args.n_boot} --method {args.method}"
          + (f" --design {args.design}" if args.design != "flat" else "")
          + (f" --n-points {args.n_points}" if args.n_points is not None else "")
          + (f" --pilot-ratio {args.pilot_ratio:g}" if args.pilot_ratio is not None else ""))
    if args.save:
        Path(args.save).write_text(json.dumps(results))
    print(summarise(results))
    print(f"\nwall time: {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
