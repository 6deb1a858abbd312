"""What the known-world generators draw, per generator and K: a summary table for planning benchmarks.

    python benchmarks/known_worlds.py --first 900000 --worlds 200 --timed 20

Per (generator, K) (``race.analysis.synthetic_worlds.make_world``; generators ``tune``, ``test``,
``steps``, K 4, 12, 24) over ``--worlds`` seeds from ``--first``: the share of null worlds, the
share of learning worlds whose crossover is after the flat grid's largest pilot (``late``), the
share of ill-behaved allocations in learning worlds (``World.ill_behaved``: rise-then-decline
curves in ``tune``, declines in ``test``, the step generator's late risers, declines, collapses and
learning-rate declines), the median optimizer steps of the costliest allocation at T/32, T/8, T/3
and T (nominal steps for the FLOP generators: ``World.step_cost``), and, over the first ``--timed``
of those seeds, the seconds to draw a world and to run the keep-all racing design once
(``simulate_race(world, RaceDesign(), None)``: rungs T/32, T/8, T/3, every allocation to every
rung, no analysis). Statistics of the draws only: no design is scored, nothing is tuned.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np


def summary_row(generator: str, k: int, seeds: range, timed: int) -> dict:
    from race.analysis.synthetic_race import RaceDesign, simulate_race
    from race.analysis.synthetic_worlds import make_world, world_stats

    stats, draw_s, race_s = [], [], []
    for i, seed in enumerate(seeds):
        t0 = time.perf_counter()
        w = make_world(generator, seed, k)
        t1 = time.perf_counter()
        stats.append(world_stats(w))
        if i < timed:
            draw_s.append(t1 - t0)
            simulate_race(w, RaceDesign(), None)
            race_s.append(time.perf_counter() - t1)
    learning = [s for s in stats if not s["null"]]
    steps = np.array([s["steps"] for s in stats])
    return {"generator": generator, "k": k, "worlds": len(stats), "null": np.mean([s["null"] for s in stats]),
            "late": np.mean([s["late"] for s in learning]) if learning else float("nan"),
            "ill": sum(s["ill"] for s in learning) / max(1, sum(s["k"] for s in learning)),
            "steps": np.median(steps, axis=0), "draw_s": float(np.mean(draw_s)) if draw_s else float("nan"),
            "race_s": float(np.mean(race_s)) if race_s else float("nan"), "timed": len(race_s)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--first", type=int, default=900000)
    ap.add_argument("--worlds", type=int, default=200)
    ap.add_argument("--timed", type=int, default=20, help="worlds (the first ones) timed with the keep-all design")
    ap.add_argument("--generators", nargs="+", default=["tune", "test", "steps"])
    ap.add_argument("--ks", type=int, nargs="+", default=[4, 12, 24])
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    print(f"# command: python benchmarks/known_worlds.py --first {args.first} --worlds {args.worlds} --timed {args.timed}")
    print("| generator | K | worlds | null | late (of learning) | ill-behaved allocations | costliest's steps at "
          "T/32, T/8, T/3, T (median) | draw a world (s) | keep-all once (s) |")
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|")
    for g in args.generators:
        for k in args.ks:
            r = summary_row(g, k, range(args.first, args.first + args.worlds), args.timed)
            steps = ", ".join(f"{x:g}" for x in r["steps"])
            print(f"| {g} | {k} | {r['worlds']} | {r['null']:.1%} | {r['late']:.1%} | {r['ill']:.1%} | {steps} | "
                  f"{r['draw_s']:.4f} | {r['race_s']:.2f} (n={r['timed']}) |", flush=True)


if __name__ == "__main__":
    main()
