"""A real replay study, read whole: standings at every read, crossover timing, seed persistence,
and every pilot design replayed on the study's own trajectories against its truth at T.

    .venv/bin/python benchmarks/replay_study.py STUDY_DIR [--target greedy] [--boot 1000] [--json out.json]

STUDY_DIR holds a study whose every allocation ran to T with the same seeds and was read at
several budgets on the way (a nested grid: configs/replay-lr.yaml, configs/replay-demo.yaml).
Printed:

- **standings**: each allocation's seed-mean score at equal counted FLOPs at every read, and
  the seeds' spread at T;
- **crossover timing**: the best allocation at T, the read from which it leads for good, and
  the share of reads at which the leader there is not the best at T;
- **seed persistence**: the correlation of a seed's offset (its score minus its allocation's
  seed mean) between each read and T (does a seed that leads early still lead at T?);
- **designs**: ``race.protocol.replay.replay`` (every design of ``race.analysis.designs``: pilots
  and unreused compute in units of T, the pick, its regret against the study's truth at T with a
  paired 95% interval over seeds x problems, whether the best was alive at the last rung).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def standings(runs, evals, target: str):
    """DataFrame: allocation x read budget -> seed-mean score at equal FLOPs; and the per-seed scores."""
    from race.analysis.curves import final_scores
    from race.analysis.tables import prepare_runs, without_controls

    prepared = without_controls(prepare_runs(runs))
    ends = final_scores(evals, prepared, target, at="equal")
    table = ends.groupby(["allocation", "budget"])["score"].mean().unstack()
    return table, ends


def crossover(table) -> dict:
    budgets = list(table.columns)
    T = budgets[-1]
    best = table[T].idxmax()
    leaders = [table[b].idxmax() for b in budgets]
    holds = next((i for i in range(len(budgets)) if all(x == best for x in leaders[i:])), len(budgets) - 1)
    return {"best": best, "leaders": leaders, "leads_from": budgets[holds],
            "share_wrong": float(np.mean([x != best for x in leaders[:-1]])) if len(budgets) > 1 else 0.0}


def persistence(ends, T: float) -> list[tuple[float, float, int]]:
    """(read, Pearson r of seed offsets between that read and T, pairs)."""
    df = ends.copy()
    df["offset"] = df["score"] - df.groupby(["allocation", "budget"])["score"].transform("mean")
    at_t = df[np.isclose(df["budget"], T)].set_index(["allocation", "seed"])["offset"]
    out = []
    for b in sorted(df["budget"].unique())[:-1]:
        x = df[np.isclose(df["budget"], b)].set_index(["allocation", "seed"])["offset"]
        both = x.index.intersection(at_t.index)
        if len(both) >= 3 and x[both].std() > 0 and at_t[both].std() > 0:
            out.append((float(b), float(np.corrcoef(x[both], at_t[both])[0, 1]), len(both)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("study_dir", type=Path)
    ap.add_argument("--target", default=None)
    ap.add_argument("--boot", type=int, default=1000)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from race.protocol import load_study
    from race.protocol.replay import replay, replay_table

    study = load_study(args.study_dir)
    target = args.target or study.primary_target
    runs, evals = study.pilot_runs, study.evals
    table, ends = standings(runs, evals, target)
    T = float(table.columns[-1])
    print(f"# study {study.name}: {len(table)} allocations, seeds {sorted(set(ends['seed']))}, T = {T:.3g}, "
          f"target {target}\n")
    print("| allocation | " + " | ".join(f"T/{T / b:.3g}" for b in table.columns) + " | seed SD at T |")
    print("|---|" + "---:|" * (len(table.columns) + 1))
    sd = ends[np.isclose(ends["budget"], T)].groupby("allocation")["score"].std(ddof=1)
    for a, row in table.sort_values(T, ascending=False).iterrows():
        print(f"| {a} | " + " | ".join(f"{v:.3f}" for v in row) + f" | {sd.get(a, float('nan')):.3f} |")
    c = crossover(table)
    print(f"\ncrossover timing: best at T {c['best']}; it leads from T/{T / c['leads_from']:.3g} on; the leader at "
          f"{c['share_wrong']:.0%} of the earlier reads is not the best at T")
    print("\nseed persistence (offset correlation with T): " + ", ".join(
        f"T/{T / b:.3g} r={r:+.2f} (n={n})" for b, r, n in persistence(ends, T)))
    out = replay(runs, evals, target=target, n_boot=args.boot)
    print("\n" + replay_table(out))
    if args.json:
        args.json.write_text(json.dumps({"standings": table.to_dict(), "crossover": c, "replay": out}, default=str,
                                        indent=1))


if __name__ == "__main__":
    sys.exit(main())
