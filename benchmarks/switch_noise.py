"""The switch rule's noise on a difference against the realised error of differences (issue 34).

    python benchmarks/switch_noise.py --generator test --first 20000 --worlds 120 --design flat
    python benchmarks/switch_noise.py --generator tune --first 1000 --worlds 90 --design race

Per learning world, the recommendation's joint replicates (``Recommendation.replicates``: what
the switch rule ``race.analysis.decision.decide`` reads) give for every other allocation j the
replicate SD of logit(F_j) - logit(F_pick); the realised error is the point forecast's
difference minus the true difference at T. Printed by the challenger's slope factor f
(``race.analysis.backtest.slope_norm``): median SD, RMS and robust (median |e| / 0.6745) realised
error, RMS of e / SD and the share beyond 1.96 (5% if the noise is right). ``--design flat``: the
flat grid at a constant learning rate (the generator's own 4-16x reach); ``race``: every
allocation raced to each rung (``RaceDesign()``, no cut) and analysed at the first (T/32) and the
last (T/3) rung, as the last rung's ``rung_decision`` does.
"""

from __future__ import annotations

import argparse

import numpy as np

BINS = ((0.0, 0.2), (0.2, 0.35), (0.35, 0.6))


def _clip(x):
    return np.clip(np.asarray(x, dtype=float), 1e-3, 1 - 1e-3)


def pairs_of(rec, truth: dict, where: str) -> list[dict]:
    """One row per challenger: replicate SD of the logit difference from the pick, realised error, f."""
    from scipy.special import logit

    p = rec.predictions
    keys = ["|".join(str(a).split("|")[:2]) for a in p["allocation"]]
    F = _clip(rec.replicates)
    pts = _clip(p["score"].to_numpy(float))
    rows = []
    for j in range(1, len(keys)):
        err = (logit(pts[j]) - logit(pts[0])) - (logit(_clip(truth[keys[j]])) - logit(_clip(truth[keys[0]])))
        rows.append({"where": where, "sd": float(np.std(logit(F[:, j]) - logit(F[:, 0]))), "err": float(err),
                     "f": float(p["factor"].iloc[j])})
    return rows


def world_pairs(generator: str, seed: int, design: str) -> list[dict]:
    from race.analysis.recommend import recommend
    from race.analysis.racing import RacingRule, rung_decision
    from race.analysis.synthetic import random_world, world_tables
    from race.analysis.synthetic_race import RaceDesign, simulate_race
    from race.analysis.synthetic_rl import rl_world
    from race.analysis.decision import Label

    w = random_world(seed) if generator == "tune" else rl_world(seed)
    if w.tags["flat"]:
        return []
    truth = {f"{a['model']}|G={a['num_generations']}": w.truth(k) for k, a in enumerate(w.allocations)}
    if design == "flat":
        runs, evals = world_tables(w, "flat-trajectory")
        recs = [("flat", recommend(evals, runs, "greedy", w.target_budget))]
    else:
        d = RaceDesign()
        out, b = simulate_race(w, d, None), d.budgets(w)
        sched = RacingRule().schedule([str(a) for a in range(len(w.allocations))], w.target_budget,
                                      first_seeds=len(w.seeds), rungs=b)
        recs = [(f"rung {k}", rung_decision(out["runs"], out["evals"], schedule=sched, rung=k,
                                            forecast=True).recommendation) for k in (0, len(b) - 1)]
    return [row for where, r in recs if r.confidence != Label.NO_LEARNING for row in pairs_of(r, truth, where)]


def summary(rows: list[dict]) -> list[str]:
    out = ["| where | challenger's f | pairs | median replicate SD | realised RMS | realised robust | RMS of e / SD | beyond 1.96 |",
           "|---|---|---:|---:|---:|---:|---:|---:|"]
    for where in sorted({r["where"] for r in rows}):
        sub = [r for r in rows if r["where"] == where]
        for lo, hi in ((0.0, 1.0), *BINS):
            s = [r for r in sub if lo <= r["f"] < hi]
            if not s:
                continue
            sd, e = np.array([r["sd"] for r in s]), np.array([r["err"] for r in s])
            z = e / np.maximum(sd, 1e-12)
            out.append(f"| {where} | {'all' if hi == 1.0 else f'{lo:g}-{hi:g}'} | {len(s)} | {np.median(sd):.3f} | "
                       f"{np.sqrt(np.mean(e**2)):.3f} | {np.median(np.abs(e)) / 0.6745:.3f} | "
                       f"{np.sqrt(np.mean(z**2)):.3f} | {np.mean(np.abs(z) > 1.96):.1%} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--generator", choices=("tune", "test"), default="test")
    ap.add_argument("--first", type=int, default=20000)
    ap.add_argument("--worlds", type=int, default=120)
    ap.add_argument("--design", choices=("flat", "race"), default="flat")
    args = ap.parse_args()
    rows = [r for s in range(args.first, args.first + args.worlds) for r in world_pairs(args.generator, s, args.design)]
    print(f"# python benchmarks/switch_noise.py --generator {args.generator} --first {args.first} "
          f"--worlds {args.worlds} --design {args.design}")
    print("\n".join(summary(rows)))


if __name__ == "__main__":
    main()
