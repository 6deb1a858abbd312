"""Does the learning gate hold its level? The gate alone on many known worlds, old rule beside new.

    python benchmarks/gate_level.py --generator test --null --worlds 2000 --first 100000 --jobs 2
    python benchmarks/gate_level.py --generator tune --learning --worlds 600 --first 1000 --jobs 2

The gate (``race.analysis.gate.learning_gate``) is cheap, so it runs on each world's tables
directly (as ``race.analysis.recommend`` calls it, no forecast): ``--null`` draws null
worlds only (nothing is learned: every pass is a false pass), ``--learning`` learning
worlds only (an all-fail gate labels the world "no learning detected": the gate's power).
For each world both degree-of-freedom rules run at each family-wise level ``--alpha``:
``welch`` (plain Welch-Satterthwaite, the earlier gate) and ``size-safe`` (the default).
The table gives the share of worlds where ANY allocation passes, with a Wilson interval,
by seed SD and seeds, seed-spread growth, collapses and problems (test generator tags).
Null worlds are drawn with ``null=True`` / ``flat=True`` from seeds outside the benchmark's
reported test range (0-999) unless ``--first`` says otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decision_quality import wilson  # noqa: E402

RULES = ("welch", "size-safe")


def world_record(generator: str, seed: int, null: bool, alphas: tuple[float, ...]) -> dict:
    """The gate on one world under each rule and level: which allocations pass, and the world's tags."""
    warnings.filterwarnings("ignore")
    from race.analysis import learning_gate, study_matrix
    from race.analysis.synthetic import random_world, world_tables
    from race.analysis.synthetic_rl import rl_world

    w = rl_world(seed, null=null) if generator == "test" else random_world(seed, flat=null)
    runs, evals = world_tables(w)
    sm = study_matrix(evals, runs, "greedy")
    allocs = sorted(sm.runs["allocation"].unique())
    out = {"seed": seed, "n_seeds": len(w.seeds), "n_problems": w.n_problems,
           "seed_sd_points": 100 * w.seed_sd, "growth": float(getattr(w, "seed_growth", 0.0)),
           "collapses": float(getattr(w, "collapse_p", 0.0)) > 0, "passes": {}}
    for a in alphas:
        for rule in RULES:
            g = learning_gate(sm, None, allocs, alpha=a, df_rule=rule)
            out["passes"][f"{rule}@{a:g}"] = int(g["passed"].sum())
    return out


def table(recs: list[dict], alphas: tuple[float, ...], null: bool) -> str:
    keys = [f"{r}@{a:g}" for a in alphas for r in RULES]
    what = "any allocation passes (false pass)" if null else "no allocation passes ('no learning detected')"
    lines = [f"| worlds: {what} | n | " + " | ".join(keys) + " |", "|---|---:|" + "---:|" * len(keys)]
    sd = np.array([r["seed_sd_points"] for r in recs])
    m = np.array([r["n_seeds"] for r in recs])
    gr = np.array([r["growth"] for r in recs])
    col = np.array([r["collapses"] for r in recs])
    P = np.array([r["n_problems"] for r in recs])
    groups = [("all", np.ones(len(recs), bool))]
    groups += [(f"seed SD {a}-{b} points, {s} seeds", (sd >= a) & (sd < b) & (m == s))
               for s in (2, 3) for a, b in ((0, 2), (2, 4), (4, 6.01), (6.01, 99))]
    groups += [(f"seed growth {a}-{b}", (gr >= a) & (gr < b)) for a, b in ((0, 0.25), (0.25, 0.51))]
    groups += [("collapses", col), ("no collapses", ~col)]
    groups += [(f"{a}-{b} problems", (P >= a) & (P < b)) for a, b in ((0, 500), (500, 2000))]
    for name, sel in groups:
        rs = [r for r, k in zip(recs, sel) if k]
        if not rs:
            continue
        cells = []
        for key in keys:
            hit = sum((r["passes"][key] > 0) if null else (r["passes"][key] == 0) for r in rs)
            lo, hi = wilson(hit, len(rs))
            cells.append(f"{hit / len(rs):.1%} [{max(lo, 0.0):.3f}, {hi:.3f}]")
        lines.append(f"| {name} | {len(rs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--generator", choices=("test", "tune"), default="test")
    kind = ap.add_mutually_exclusive_group(required=True)
    kind.add_argument("--null", action="store_true", help="null worlds only (false passes)")
    kind.add_argument("--learning", action="store_true", help="learning worlds only (power)")
    ap.add_argument("--worlds", type=int, default=2000)
    ap.add_argument("--first", type=int, default=100000)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--alpha", type=float, nargs="+", default=[0.05], help="family-wise levels to run")
    args = ap.parse_args()
    alphas = tuple(args.alpha)
    t0 = time.time()
    seeds = range(args.first, args.first + args.worlds)
    with ProcessPoolExecutor(args.jobs) as ex:
        recs = list(ex.map(world_record, [args.generator] * len(seeds), seeds, [args.null] * len(seeds),
                           [alphas] * len(seeds), chunksize=20))
    kind = "null" if args.null else "learning"
    print(f"# gate level: {len(recs)} {kind} worlds of the {args.generator} generator, seeds {args.first}.."
          f"{args.first + args.worlds - 1}")
    print(f"# command: python benchmarks/gate_level.py --generator {args.generator} --{kind} --worlds {args.worlds} "
          f"--first {args.first} --jobs {args.jobs} --alpha {' '.join(f'{a:g}' for a in alphas)}")
    if args.generator == "tune":
        print("# tuning generator: 'seed SD ... points' is its logit-scale seed SD x 100, not score points; "
              "it has no seed growth or collapses")
    print(table(recs, alphas, args.null))
    print(f"\nwall time: {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
