"""Are the joint model's intervals calibrated at every distance from the target? Measured on the TUNING generator.

    python benchmarks/reach_calibration.py --first 1000 --worlds 400 --jobs 2                  # design seeds
    python benchmarks/reach_calibration.py --first 1400 --worlds 400 --jobs 2 --misfit 0,0.7 --scales 1.6,1.8
    python benchmarks/reach_calibration.py --advice --first 1800 --worlds 200 --jobs 2      # the pilot advice

The back-tested extrapolation error (``race.analysis.backtest``) scales with the effective
reach D = f sqrt(r_m^2 + d^2): d the log-FLOP reach past the last pilot, f the slope factor,
r_m the misfit reach. Its two constants for the joint model, the prior scale s0
(``JOINT_PRIOR_SCALE``) and r_m (``JOINT_MISFIT_REACH``), were set here. Every tuning world
(``race.analysis.synthetic.random_world``; the test generator is never tuned on) is analysed
with its pilots where the generator put them (4-16x below the target: "own") and moved to
1.25, 1.5, 2, 3 and 6x below it (``race.analysis.synthetic.move_pilots``: same curves, seeds
and target). For each world the forecast parts are computed once exactly as the
recommendation computes them (``race.analysis.forecast.forecast_parts``: joint replicates
without noise, the back-test table); then, for every (r_m, s0) on the grid, the study's
back-test scales are recomputed with that r_m, pooled with s0, and the noise is drawn onto
the replicates as :meth:`race.analysis.backtest.BackTest.noise` draws it. Printed: coverage
of the default pick's (the observed winner's) 95% interval and its median width, per
distance, and the pair whose worst distance is nearest 95% (the rule the frozen values were
chosen by, on seeds 1000-1399, then confirmed on 1400-1799).

``--advice`` checks what the report says about a narrower interval
(``race.analysis.pilot_reach``: how close to the target the largest pilot must run for a
95% interval 0.25 wide): for every tuning world whose advice is to move the pilots, the
pilots are moved to the advised distance and the recommendation is made again; printed are
the widths and coverage there. Every world's estimated width with the pilots 2x below the
target is also set beside the width measured with the pilots moved there.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp

import numpy as np
import pandas as pd
from scipy.special import expit

DISTANCES = (None, 1.25, 1.5, 2.0, 3.0, 6.0)  # None: the world's own pilots


def world_parts(arg: tuple[int, float | None]) -> dict | None:
    """One tuning world's forecast parts with its pilots ``ratio`` x below the target (None: not moved);
    None for a null world or one whose gate passes nothing."""
    from race.analysis.forecast import forecast_parts, spend_share, standings
    from race.analysis.recommend import gated_study
    from race.analysis.synthetic import move_pilots, random_world, world_tables

    seed, ratio = arg
    w = random_world(seed)
    if ratio is not None:
        w = move_pilots(w, ratio)
    runs, evals = world_tables(w)
    sm, allocs, reps, gate, gen = gated_study(evals, runs, "greedy")
    if w.tags["flat"] or not gate["passed"].any():
        return None
    passed = set(gate.loc[gate["passed"], "allocation"])
    fc = float(w.target_budget * spend_share(sm))
    info, F0, eff, bt = forecast_parts(sm, reps, allocs, {a: ("joint",) if a in passed else ("constant",) for a in allocs},
                                       fc, gen)
    d = np.maximum(np.log(fc) - info["x_max"].to_numpy(float), 0.0)
    factor = eff / np.sqrt(bt.misfit_reach**2 + d**2)  # the slope factor f, undone from the effective reach
    names, obs, _ = standings(sm, reps, allocs, float(sm.runs["budget"].max()))
    keys = [f"{c['model']}|G={c['num_generations']}" for c in w.allocations]
    truth = np.array([w.truth(keys.index("|".join(a.split("|")[:2]))) for a in allocs])
    return dict(seed=seed, ratio="own" if ratio is None else f"{ratio:g}", F0=F0, d=d, f=factor, table=bt.table,
                truth=truth, pick=int(np.argmax([obs[names.index(a)] for a in allocs])))


def coverage(parts: list[dict], misfit: float, s0: float, level: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """Per world: is the default pick's truth inside its level interval, and the interval's width,
    with the error model's constants set to (``misfit``, ``s0``)."""
    from race.analysis.backtest import PRIOR_PAIRS, effective_reach, error_scale, logit

    rng = np.random.default_rng(seed)
    rows = []
    for p in parts:
        used = p["table"][p["table"]["used"]]
        sh, sp, n = error_scale(used, misfit) if len(used) else (0.0, 0.0, 0)
        S_sh = np.sqrt((n * sh**2 + PRIOR_PAIRS * s0**2 / 2) / (n + PRIOR_PAIRS))
        S_sp = np.sqrt((n * sp**2 + PRIOR_PAIRS * s0**2 / 2) / (n + PRIOR_PAIRS))
        R, K = p["F0"].shape
        D = effective_reach(p["d"], p["f"], misfit)
        noise = D[None, :] * (rng.standard_normal((R, 1)) * S_sh + rng.standard_normal((R, K)) * S_sp)
        F = expit(logit(p["F0"]) + noise)[:, p["pick"]]
        lo, hi = np.quantile(F, [(1 - level) / 2, (1 + level) / 2])
        t = p["truth"][p["pick"]]
        rows.append(dict(seed=p["seed"], ratio=p["ratio"], covered=bool(lo <= t <= hi), width=float(hi - lo)))
    return pd.DataFrame(rows)


def advice_check(seed: int) -> dict | None:
    """One tuning world: the recommendation's advice for a narrower interval
    (``race.analysis.pilot_reach``) and, when it says to move the pilots, the interval the
    recommendation gives with the pilots moved there (None: null world or no forecast)."""
    from race.analysis import recommend
    from race.analysis.synthetic import move_pilots, random_world, world_tables

    def call(w):
        runs, evals = world_tables(w)
        rec = recommend(evals, runs, "greedy", w.target_budget, n_boot=200, rng=0)
        keys = [f"{c['model']}|G={c['num_generations']}" for c in w.allocations]
        t = w.truth(keys.index("|".join(rec.allocation.split("|")[:2])))
        return rec, t

    w = random_world(seed)
    rec, t = call(w)
    if w.tags["flat"] or not rec.forecast_made:
        return None
    a = rec.pilot_advice
    row = dict(seed=seed, status=a["status"], goal=a["goal"], width=rec.predicted_hi - rec.predicted_lo,
               covered=rec.predicted_lo <= t <= rec.predicted_hi, ratio=a["ratio"], moved_width=np.nan,
               moved_covered=np.nan, est2=a["widths"].get("2", np.nan), at2_width=np.nan, at2_covered=np.nan)
    if "2" in a["widths"]:  # the estimated width with the pilots 2x below the target, against the one measured there
        at2, t2 = call(move_pilots(w, 2.0))
        if at2.forecast_made:
            row.update(at2_width=at2.predicted_hi - at2.predicted_lo, at2_covered=at2.predicted_lo <= t2 <= at2.predicted_hi)
    if a["status"] == "move":
        moved, tm = call(move_pilots(w, max(a["ratio"], 1.0)))
        if moved.forecast_made:
            row.update(moved_width=moved.predicted_hi - moved.predicted_lo,
                       moved_covered=moved.predicted_lo <= tm <= moved.predicted_hi)
    return row


def advice(args: argparse.Namespace) -> None:
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        rows = [r for r in pool.imap(advice_check, range(args.first, args.first + args.worlds), chunksize=2) if r]
    d = pd.DataFrame(rows)
    print(f"# pilot advice: tuning seeds {args.first}..{args.first + args.worlds - 1}, {len(d)} learning worlds with "
          f"a forecast\n# command: python benchmarks/reach_calibration.py --advice --first {args.first} --worlds "
          f"{args.worlds} --jobs {args.jobs}\n")
    print("| advice | worlds | median width now | coverage now | median advised ratio | median width, pilots moved "
          "| share <= goal | share <= 1.25 goal | coverage, pilots moved |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for status, g in d.groupby("status"):
        m = g.dropna(subset=["moved_width"])
        moved = (f"{m['moved_width'].median():.3f} | {np.mean(m['moved_width'] <= m['goal']):.0%} | "
                 f"{np.mean(m['moved_width'] <= 1.25 * m['goal']):.0%} | {m['moved_covered'].astype(float).mean():.1%}"
                 if len(m) else "- | - | - | -")
        ratio = f"{g['ratio'].median():.2f}" if g["ratio"].notna().any() else "-"
        print(f"| {status} | {len(g)} | {g['width'].median():.3f} | {g['covered'].mean():.1%} | {ratio} | {moved} |")
    m = d.dropna(subset=["est2", "at2_width"])
    if len(m):
        r = np.log(m["at2_width"] / m["est2"])
        print(f"\nwith the pilots moved to 2x below the target ({len(m)} worlds): estimated median width "
              f"{m['est2'].median():.3f}, measured {m['at2_width'].median():.3f}; measured / estimated: median "
              f"{np.exp(r.median()):.2f}, 10-90% {np.exp(r.quantile(0.1)):.2f}-{np.exp(r.quantile(0.9)):.2f}; "
              f"coverage there {m['at2_covered'].astype(float).mean():.1%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--first", type=int, default=1000, help="first tuning seed (1000-1399 set the frozen values)")
    ap.add_argument("--worlds", type=int, default=400)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--misfit", default="0,0.25,0.5,0.6,0.7,0.75,0.8,1.0", help="misfit reaches r_m to try (ln C)")
    ap.add_argument("--scales", default="1.4,1.5,1.6,1.7,1.8", help="prior scales s0 to try")
    ap.add_argument("--advice", action="store_true",
                    help="check the recommendation's advice for a narrower interval instead: move the pilots where it "
                    "says and measure the interval there")
    args = ap.parse_args()
    if args.advice:
        return advice(args)
    if args.first < 1000:
        ap.error("tuning seeds start at 1000 (seeds below are kept for tests and demos)")
    tasks = [(s, r) for r in DISTANCES for s in range(args.first, args.first + args.worlds)]
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        parts = [p for p in pool.imap(world_parts, tasks, chunksize=4) if p is not None]
    order = ["own"] + [f"{r:g}" for r in DISTANCES if r is not None]
    print(f"# reach calibration: tuning seeds {args.first}..{args.first + args.worlds - 1}, {len(parts)} analysed "
          f"(world x distance)\n# command: python benchmarks/reach_calibration.py --first {args.first} --worlds "
          f"{args.worlds} --jobs {args.jobs} --misfit {args.misfit} --scales {args.scales}")
    print("\n| r_m | s0 | all | " + " | ".join(f"{o}x" if o != "own" else "own (4-16x)" for o in order)
          + " | worst distance off 95% |")
    print("|---:|---:|---:|" + "---:|" * len(order) + "---:|")
    best = None
    for m in (float(v) for v in args.misfit.split(",")):
        for s0 in (float(v) for v in args.scales.split(",")):
            d = coverage(parts, m, s0)
            g = d.groupby("ratio").agg(cov=("covered", "mean"), width=("width", "median"))
            worst = float(np.max(np.abs(g["cov"] - 0.95)))
            cells = " | ".join(f"{g.loc[o, 'cov']:.1%} / {g.loc[o, 'width']:.3f}" for o in order if o in g.index)
            print(f"| {m:g} | {s0:g} | {d['covered'].mean():.1%} / {d['width'].median():.3f} | {cells} | {worst:.3f} |")
            if best is None or worst < best[0]:
                best = (worst, m, s0)
    print("\n(cells: coverage of the default pick's 95% interval / its median width)")
    print(f"nearest 95% at its worst distance: r_m = {best[1]:g}, s0 = {best[2]:g} ({best[0]:.1%} off)")


if __name__ == "__main__":
    main()
