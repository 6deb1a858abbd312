"""Where the width of the chosen allocation's 95% interval comes from, measured on the TUNING generator.

    python benchmarks/interval_width.py --worlds 300 --first 1000 --jobs 2          # tuning worlds
    python benchmarks/interval_width.py --saved /tmp/dq_test.json                    # a saved test run, read only

For every tuning world (``race.analysis.synthetic.random_world``, seeds 1000+) whose gate passes,
the joint model's forecast parts are computed exactly as the recommendation computes them
(``race.analysis.forecast.forecast_parts``) and, for the observed winner at the largest pilot
(the default pick), printed:

- the interval's logit-scale variance split into the joint replicates' spread and the
  back-tested extrapolation noise, and the noise's pooled scale split into the study's own
  back-tests and the prior (``race.analysis.backtest``);
- width, coverage and the true error at the target by how the midpoint was located, the
  target's extrapolation ratio, the pilots' logit slope |b| and the world's curve family;
- whether in-study back-tests predict the target's error: the correlation of log |error at
  the target| / (reach x slope factor) with the log of the study's own scale, from the three
  budget-origin pairs and (``--prefix``) from every evaluation point of the smaller budgets
  as an origin (tens of pairs per study);
- the smallest median width that reaches 95% coverage with one multiplier on several
  normalisations of the reach (uncapped and capped slope factor), and with a multiplier per
  curve family (an oracle that knows the family: what per-world calibration could reach).

``--saved FILE`` reads per-world records written by ``benchmarks/decision_quality.py --save``
and prints width / coverage / error of the chosen interval by label, target ratio, forecast
level and forecast rise over the last observation (nothing is recomputed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
from functools import partial

import numpy as np
import pandas as pd

Z95 = 1.959964


def _prefix_scale(sm, passed: list[str], norms: dict, target_ratio: float) -> float:
    """RMS of the back-test errors per unit (reach x slope factor) with every evaluation point of the
    smaller budgets as an origin (the joint model fitted on all points at ln C <= the origin)."""
    from race.analysis.backtest import logit
    from race.analysis.joint_forecast import joint_data
    from race.analysis.joint_model import fit_joint

    runs = sm.runs
    P = sm.points.assign(alloc=runs["allocation"].to_numpy()[sm.points["run"].to_numpy()],
                         budget=runs["budget"].to_numpy()[sm.points["run"].to_numpy()],
                         x=np.log(sm.points["flops"].to_numpy(float)))
    P["j"] = P.groupby("run").cumcount()
    lev = P.groupby(["alloc", "budget", "j"]).agg(x=("x", "mean"), y=("score", "mean")).reset_index()
    origins = sorted(P[P["budget"] < P["budget"].max()].groupby(["budget", "j"])["x"].mean().to_numpy())
    u = []
    for xo in origins[1:]:
        sub = dataclasses.replace(sm, points=sm.points[P["x"].to_numpy() <= xo + 1e-9], point_pp=None)
        names, d, _ = joint_data(sub, None, passed)
        if d is None or len(names) < len(passed):
            continue
        fit = fit_joint(d)
        for k, a in enumerate(names):
            xa = d.x[d.alloc == k]
            for _, t in lev[(lev["alloc"] == a) & (lev["x"] > xa.max() + 0.05)].iterrows():
                reach = t["x"] - xa.max()
                if reach / max(xa.max() - xa.min(), 1e-9) <= 1.5 * target_ratio:
                    u.append((logit(fit.predict(t["x"])[0, k]) - logit(t["y"])) / (reach * norms[a]))
    return float(np.sqrt(np.mean(np.square(u)))) if u else float("nan")


def world_row(seed: int, prefix: bool = False) -> dict | None:
    """One tuning world's decomposition of the default pick's interval (None: null world or gate failed)."""
    from race.analysis.backtest import PRIOR_PAIRS, SLOPE_FLOOR, logit
    from race.analysis.forecast import forecast_parts, slope_of, spend_share, standings
    from race.analysis.recommend import gated_study
    from race.analysis.synthetic import random_world, world_tables

    w = random_world(seed)
    runs, evals = world_tables(w)
    sm, allocs, reps, gate, _ = gated_study(evals, runs, "greedy")
    if w.tags["flat"] or not gate["passed"].any():
        return None
    passed = [a for a in allocs if a in set(gate.loc[gate["passed"], "allocation"])]
    names, obs, _ = standings(sm, reps, allocs, float(sm.runs["budget"].max()))
    k = int(np.argmax(obs))
    a = names[k]
    fams = {b: ("joint",) if b in passed else ("constant",) for b in allocs}
    fc = float(w.target_budget * spend_share(sm))
    info, F0, reach, bt = forecast_parts(sm, reps, allocs, fams, fc, np.random.default_rng(1))
    g = sm.runs.assign(end=sm.end, lnc=np.log(sm.runs["end_flops"].to_numpy(float)))
    g = g[g["allocation"] == a].groupby("budget")[["lnc", "end"]].mean()
    b = abs(float(np.polyfit(g["lnc"], logit(g["end"]), 1)[0]))
    sh, sp = bt.pooled()
    n, n0, s0 = bt.n_pairs, PRIOR_PAIRS, bt.prior_scale
    study = n * (bt.s_shared**2 + bt.s_specific**2)
    row = info.iloc[k]
    D = float(np.log(fc) - row["x_max"])
    truth = w.truth([f"{c['model']}|G={c['num_generations']}" for c in w.allocations].index("|".join(a.split("|")[:2])))
    out = dict(seed=seed, family=w.tags["family"], ratio=w.tags["target_ratio"], located=row.get("midpoint"),
               point=float(row["point"]), truth=truth, D=D, b=b, factor=float(slope_of(sm, a)),
               rep_var=float(np.var(logit(F0[:, k]))), noise_var=float(bt.sd(reach[k]) ** 2),
               prior_share=float(n0 * s0**2 / (study + n0 * s0**2)), s_study=float(np.hypot(bt.s_shared, bt.s_specific)),
               pooled=float(np.hypot(sh, sp)), error=float(logit(row["point"]) - logit(truth)), floor=SLOPE_FLOOR)
    if prefix:
        out["s_prefix"] = _prefix_scale(sm, passed, {c: slope_of(sm, c) for c in passed},
                                        D / max(float(row["x_max"] - row["x_min"]), 1e-9))
    return out


def _table(d: pd.DataFrame, by) -> str:
    g = d.groupby(by, observed=True)
    t = pd.DataFrame({"n": g.size(), "median width": g["width"].median(), "coverage": g["covered"].mean(),
                      "replicates' share of variance": g["rep_share"].median(),
                      "median |error| (logit)": g["error"].apply(lambda e: e.abs().median()),
                      "95th pct |error|": g["error"].apply(lambda e: e.abs().quantile(0.95))})
    if t["replicates' share of variance"].isna().all():
        t = t.drop(columns="replicates' share of variance")
    return t.to_string(float_format=lambda v: f"{v:.3f}")


def min_width(d: pd.DataFrame, scale: pd.Series, groups: pd.Series | None = None) -> float:
    """Median width of point +- q scale (logit) with q the 95th percentile of |error| / scale (per group)."""
    from scipy.special import expit, logit

    r = d["error"].abs() / scale
    q = r.groupby(groups).transform(lambda x: x.quantile(0.95)) if groups is not None else r.quantile(0.95)
    lp = logit(d["point"].clip(1e-3, 1 - 1e-3))
    return float(np.median(expit(lp + q * scale) - expit(lp - q * scale)))


def tuning(args: argparse.Namespace) -> None:
    from scipy.special import expit

    with mp.get_context("spawn").Pool(args.jobs) as pool:
        rows = [r for r in pool.map(partial(world_row, prefix=args.prefix), range(args.first, args.first + args.worlds),
                                    chunksize=4) if r]
    d = pd.DataFrame(rows)
    sd = np.sqrt(d["rep_var"] + d["noise_var"])
    lp = np.log(d["point"] / (1 - d["point"]))
    d["width"] = expit(lp + Z95 * sd) - expit(lp - Z95 * sd)
    d["covered"] = d["error"].abs() <= Z95 * sd
    d["rep_share"] = d["rep_var"] / sd**2
    print(f"# interval width on the tuning generator: seeds {args.first}..{args.first + args.worlds - 1}, "
          f"{len(d)} learning worlds whose gate passed; the default pick's 95% interval (logit-normal)")
    print(f"median width {d['width'].median():.3f}, coverage {d['covered'].mean():.1%}; median share of the "
          f"interval's variance from the joint replicates {d['rep_share'].median():.1%} (the rest: back-tested "
          f"noise); median prior share of the pooled noise scale {d['prior_share'].median():.1%}; study's own "
          f"scale {d['s_study'].median():.3f} vs pooled {d['pooled'].median():.3f} (logit per unit reach x factor)\n")
    for name, by in (("located", "located"), ("target ratio", pd.cut(d["ratio"], [0, 6, 10, 16])),
                     ("pilots' |logit slope| b", pd.cut(d["b"], [0, 0.05, 0.2, 0.4, 1, 50])), ("curve family", "family")):
        print(f"by {name}\n{_table(d, by)}\n")
    z = np.log(d["error"].abs() / (d["D"] * d["factor"]) + 1e-6)
    print(f"corr(log |target error| / reach, log study scale (3 budget origins)) = "
          f"{np.corrcoef(z, np.log(d['s_study'] + 1e-6))[0, 1]:+.3f}")
    if args.prefix:
        ok = d["s_prefix"].notna()
        print(f"corr(..., log scale from every evaluation point as an origin) = "
              f"{np.corrcoef(z[ok], np.log(d.loc[ok, 's_prefix'] + 1e-6))[0, 1]:+.3f}")
    b = d["b"]
    print("\n| reach normalisation (one multiplier for 95%) | median width |\n|---|---:|")
    for name, s in (("ln C reach x (|b| + c0) uncapped", d["D"] * (b + d["floor"])),
                    ("ln C reach x min(|b| + c0, 0.5)", d["D"] * np.minimum(b + d["floor"], 0.5)),
                    ("ln C reach x min(|b| + c0, 0.3)", d["D"] * np.minimum(b + d["floor"], 0.3)),
                    ("ln C reach x min(|b| + c0, 0.8)", d["D"] * np.minimum(b + d["floor"], 0.8)),
                    ("ln C reach only", d["D"])):
        print(f"| {name} | {min_width(d, s):.3f} |")
    s = d["D"] * d["factor"]
    print(f"| as the code does x the study's own scale (3 budget origins; per-world, no prior) | "
          f"{min_width(d, s * d['s_study'].clip(lower=1e-3)):.3f} |")
    if args.prefix:
        ok = d["s_prefix"].notna()
        print(f"| as the code does x the scale from every evaluation point as an origin (per-world, no prior; "
              f"{int(ok.sum())} worlds) | {min_width(d[ok], (s * d['s_prefix'].clip(lower=1e-3))[ok]):.3f} |")
    print(f"| as the code does, one multiplier per curve family (oracle) | {min_width(d, s, d['family']):.3f} |")


def saved(path: str) -> None:
    recs = json.loads(open(path).read())
    rows = []
    for r in recs:
        if r["confidence"] == "no learning detected":
            continue
        p = next(p for p in r["predictions"] if p["allocation"] == r["chosen"])
        lg = (lambda v: float(np.log(np.clip(v, 1e-3, 1 - 1e-3) / (1 - np.clip(v, 1e-3, 1 - 1e-3)))))
        rows.append(dict(label=r["confidence"], ratio=r["tags"]["target_ratio"], width=p["hi"] - p["lo"],
                         covered=p["lo"] <= p["truth"] <= p["hi"], error=lg(p["score"]) - lg(p["truth"]),
                         level=p["score"], rise=p["score"] - r["observed"][r["chosen"]], rep_share=np.nan))
    d = pd.DataFrame(rows)
    print(f"# {path}: {len(d)} chosen intervals (read only)")
    for name, by in (("label", "label"), ("target ratio", pd.cut(d["ratio"], [0, 6, 10, 16])),
                     ("forecast level", pd.cut(d["level"], [0, 0.4, 0.6, 0.8, 1])),
                     ("forecast rise over the last observation", pd.cut(d["rise"], [-1, 0, 0.05, 0.1, 0.2, 1]))):
        print(f"by {name}\n{_table(d, by)}\n")
    print(f"95th percentile of |logit error|: {d['error'].abs().quantile(0.95):.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", type=int, default=300)
    ap.add_argument("--first", type=int, default=1000, help="tuning seeds are 1000 and up")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--prefix", action="store_true", help="also back-test from every evaluation point (slower)")
    ap.add_argument("--saved", help="decompose a decision_quality.py --save file instead (read only)")
    args = ap.parse_args()
    if args.saved:
        return saved(args.saved)
    if args.first < 1000:
        raise SystemExit("tuning seeds are 1000 and up")
    tuning(args)


if __name__ == "__main__":
    main()
