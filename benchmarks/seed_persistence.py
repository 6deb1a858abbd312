"""Does a seed's lead persist? Correlation of seed offsets between budgets, on a study's runs.

    .venv/bin/python benchmarks/seed_persistence.py STUDY_DIR [--target greedy] [--boot 2000]

For every allocation and budget with two or more seeds, a seed's *offset* is its score at
that budget (the run's final evaluation on ``--target``: for a nested or racing study, the
reading where a run of that budget stops) minus the mean over the allocation's seeds there.
For each pair of budgets where seeds overlap, the table gives the Pearson correlation of the
offsets over the (allocation, seed) pairs present at both, with a 95% bootstrap interval over
allocations (whole allocations resampled, so the offsets that sum to zero within one stay
together), the number of pairs and the seed SD at each budget (the root mean square offset,
corrected for the mean taken out). A correlation near 1 says a seed that leads early keeps
its lead; near 0, that a seed's early lead is noise for a later budget.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def offsets(study_dir: Path, target: str):
    """DataFrame (allocation, budget, seed, score, offset) of the study's complete runs."""
    from race.analysis import prepare_runs
    from race.grid import load_tables

    t = load_tables(study_dir)
    runs = prepare_runs(t["runs"])
    ev = t["evals"][t["evals"]["target"] == target].sort_values(["run_id", "step"])
    last = ev.groupby("run_id")["score"].last()
    df = runs.assign(score=runs["run_id"].map(last))[["allocation", "budget", "seed", "score"]].dropna()
    df["budget"] = df["budget"].astype(float)
    n = df.groupby(["allocation", "budget"])["seed"].transform("count")
    df = df[n >= 2].copy()
    df["offset"] = df["score"] - df.groupby(["allocation", "budget"])["score"].transform("mean")
    df["n"] = df.groupby(["allocation", "budget"])["seed"].transform("count")
    return df


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 3 or a.std() == 0 or b.std() == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def persistence(df, boot: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    budgets = sorted(df["budget"].unique())
    for b1, b2 in itertools.combinations(budgets, 2):
        x = df[df["budget"] == b1].set_index(["allocation", "seed"])
        y = df[df["budget"] == b2].set_index(["allocation", "seed"])
        both = x.index.intersection(y.index)
        if len(both) < 3:
            continue
        xs, ys = x.loc[both, "offset"].to_numpy(), y.loc[both, "offset"].to_numpy()
        allocs = np.array([a for a, _ in both])
        names = np.unique(allocs)
        draws = []
        for _ in range(boot):
            pick = rng.choice(names, size=len(names), replace=True)
            idx = np.concatenate([np.flatnonzero(allocs == a) for a in pick])
            draws.append(correlation(xs[idx], ys[idx]))
        draws = np.array([d for d in draws if np.isfinite(d)])

        def sd(frame, keys):
            f = frame.loc[keys]
            return float(np.sqrt((f["offset"] ** 2 * f["n"] / (f["n"] - 1)).mean()))

        rows.append({"budget_a": b1, "budget_b": b2, "pairs": len(both), "allocations": len(names),
                     "r": correlation(xs, ys), "lo": float(np.quantile(draws, 0.025)) if len(draws) else float("nan"),
                     "hi": float(np.quantile(draws, 0.975)) if len(draws) else float("nan"),
                     "seed_sd_a": sd(x, both), "seed_sd_b": sd(y, both)})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("study_dir", type=Path)
    ap.add_argument("--target", default="greedy")
    ap.add_argument("--boot", type=int, default=2000)
    args = ap.parse_args(argv)
    rows = persistence(offsets(args.study_dir, args.target), args.boot)
    print(f"seed-offset persistence in {args.study_dir} ({args.target}; final score of each run at its budget)")
    print("| budget a | budget b | (allocation, seed) pairs | allocations | r [95% over allocations] | seed SD a | "
          "seed SD b |")
    print("|---|---|---:|---:|---|---:|---:|")
    for r in rows:
        print(f"| {r['budget_a']:.3g} | {r['budget_b']:.3g} | {r['pairs']} | {r['allocations']} | {r['r']:+.2f} "
              f"[{r['lo']:+.2f}, {r['hi']:+.2f}] | {r['seed_sd_a']:.3f} | {r['seed_sd_b']:.3f} |")
    if not rows:
        print("no two budgets share three or more (allocation, seed) pairs")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())
