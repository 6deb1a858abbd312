"""Set the joint model's back-test prior and compare the forecast methods on the TUNING generator only.

    python benchmarks/joint_tuning.py --worlds 200 --first 1000 --jobs 2

For every tuning world (``race.analysis.synthetic.random_world``, seeds 1000+) whose gate
passes, the recommendation's forecast replicates are computed once per method WITHOUT the
back-tested extrapolation noise (``race.analysis.forecast.forecast_parts``): ``curve`` (the
per-allocation families), ``curve3`` (the same without power and quadratic), ``joint`` (the
joint model). The noise of step 5 is then added for each prior scale s0 in the sweep (the
study's back-test pooled with the prior, exactly as ``BackTest.noise`` does) and the decision
rule of step 6 applied. Printed per (method, s0): mean regret against the truth, the paired
95% world-bootstrap interval of RACE minus the observed winner, the same in worlds whose
crossover falls after the last pilot, the chosen allocation's coverage, median interval width
and share of upper bounds at 1.0, and the held-out skill of the point forecasts (mean |logit
error| of every allocation at the target). Never run it on the test generator.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import sys
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
SCALES = (0.5, 0.75, 1.0, 1.5, 1.75, 1.8, 1.85, 2.0, 2.25)
METHODS = {"curve": None, "curve3": ("constant", "loglinear", "sigmoid"), "joint": ("joint",)}


def world_record(seed: int, methods: tuple[str, ...] = tuple(METHODS)) -> dict:
    from race.analysis.forecast import forecast_parts, spend_share, standings
    from race.analysis.recommend import gated_study
    from race.analysis.families import FAMILIES
    from race.analysis.synthetic import random_world, world_tables
    from race.analysis.synthetic_rl import crossover_class

    w = random_world(seed)
    runs, evals = world_tables(w)
    sm, allocs, reps, gate, _ = gated_study(evals, runs, "greedy")
    truth = {f"{a['model']}|G={a['num_generations']}": w.truth(k) for k, a in enumerate(w.allocations)}
    short = ["|".join(a.split("|")[:2]) for a in allocs]
    rec = {"seed": seed, "flat": bool(w.tags["flat"]), "crossover": crossover_class(w), "allocs": short,
           "truth": [truth[s] for s in short], "passed": bool(gate["passed"].any()), "methods": {}}
    largest = float(sm.runs["budget"].max())
    names, pts, _ = standings(sm, reps, allocs, largest)
    rec["default"] = int(np.argmax(pts))
    if not rec["passed"]:
        return rec
    passed = set(gate.loc[gate["passed"], "allocation"])
    fc = float(w.target_budget * spend_share(sm))
    for m in methods:
        fams = METHODS[m] or FAMILIES
        info, F0, reach, bt = forecast_parts(sm, reps, allocs, {a: fams if a in passed else ("constant",)
                                                                 for a in allocs}, fc, np.random.default_rng(1))
        rec["methods"][m] = {"F0": F0.tolist(), "reach": reach.tolist(), "s_shared": bt.s_shared,
                             "s_specific": bt.s_specific, "n_pairs": bt.n_pairs,
                             "point": info["point"].tolist(),
                             "unidentified": [bool(u) for u in info["unidentified"]]}
    return rec


def paired(d: np.ndarray, n_boot: int = 4000) -> tuple[float, float]:
    idx = np.random.default_rng(0).integers(0, len(d), size=(n_boot, len(d)))
    m = d[idx].mean(axis=1)
    return float(np.quantile(m, 0.025)), float(np.quantile(m, 0.975))


def evaluate(records: list[dict], method: str, s0: float, alpha: float = 0.05) -> dict:
    from scipy.special import expit

    from race.analysis.backtest import BackTest, logit
    from race.analysis.decision import decide

    reg, reg_obs, late, cov, width, at1, err = [], [], [], [], [], [], []
    for r in records:
        if r["flat"]:
            continue
        truth = np.array(r["truth"])
        best = truth.max()
        d = r["default"]
        if not r["passed"]:
            pick = d
        else:
            mm = r["methods"][method]
            F0 = np.array(mm["F0"])
            bt = BackTest(table=None, s_shared=mm["s_shared"], s_specific=mm["s_specific"], n_pairs=mm["n_pairs"],
                          picked_right=None, prior_scale=s0)
            F = expit(logit(F0) + bt.noise(np.array(mm["reach"]), F0.shape[0], F0.shape[1],
                                           np.random.default_rng(r["seed"])))
            names = list(range(F.shape[1]))
            pick = decide(F, names, d, alpha)[0]
            lo, hi = np.quantile(F[:, pick], [0.025, 0.975])
            cov.append(lo <= truth[pick] <= hi)
            width.append(hi - lo)
            at1.append(hi >= 0.999)
            err.extend(np.abs(logit(np.array(mm["point"])) - logit(truth)))
        reg.append(best - truth[pick])
        reg_obs.append(best - truth[d])
        late.append(r["crossover"] == "after")
    reg, reg_obs, late = np.array(reg), np.array(reg_obs), np.array(late)
    out = {"method": method, "s0": s0, "n": len(reg), "regret": reg.mean(), "observed": reg_obs.mean(),
           "diff": reg.mean() - reg_obs.mean(), "diff_ci": paired(reg - reg_obs), "switches": int(np.sum(reg != reg_obs)),
           "coverage": float(np.mean(cov)), "width": float(np.median(width)), "at1": float(np.mean(at1)),
           "abs_logit_err": float(np.mean(err))}
    if late.any():
        out["late"] = (reg[late].mean(), reg_obs[late].mean(), int(late.sum()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", type=int, default=200)
    ap.add_argument("--first", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--records", help="reuse (or write) the per-world records here")
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of " + ", ".join(METHODS))
    ap.add_argument("--alpha", type=float, default=None,
                    help="switch level of the decision (default: ConfidenceRules().switch_alpha)")
    ap.add_argument("--scales", default=None, help="comma-separated prior scales s0 (default: " +
                    ", ".join(map(str, SCALES)) + ")")
    args = ap.parse_args()
    if args.first < 1000:
        sys.exit("tuning seeds are 1000 and up")
    path = Path(args.records) if args.records else None
    if path is not None and path.exists():
        records = json.loads(path.read_text())
    else:
        with mp.get_context("spawn").Pool(args.jobs) as pool:
            records = pool.map(partial(world_record, methods=tuple(args.methods.split(","))),
                               range(args.first, args.first + args.worlds), chunksize=4)
        if path is not None:
            path.write_text(json.dumps(records))
    print(f"# joint tuning: {len(records)} tune-generator worlds, seeds {args.first}..{args.first + args.worlds - 1}")
    print("| method | s0 | learning worlds | mean regret | RACE - observed [95% paired] | switches | after: RACE / obs "
          "| coverage | median width | hi at 1.0 | mean abs logit error |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    from race.analysis.decision import ConfidenceRules

    alpha = ConfidenceRules().switch_alpha if args.alpha is None else args.alpha
    scales = tuple(float(v) for v in args.scales.split(",")) if args.scales else SCALES
    print(f"(switch level {alpha:g})")
    for m in args.methods.split(","):
        for s0 in scales:
            e = evaluate(records, m, s0, alpha=alpha)
            late = e.get("late")
            lt = f"{late[0]:.4f} / {late[1]:.4f} (n={late[2]})" if late else ""
            print(f"| {m} | {s0:g} | {e['n']} | {e['regret']:.4f} | {e['diff']:+.4f} [{e['diff_ci'][0]:+.4f}, "
                  f"{e['diff_ci'][1]:+.4f}] | {e['switches']} | {lt} | {e['coverage']:.1%} | {e['width']:.3f} | "
                  f"{e['at1']:.1%} | {e['abs_logit_err']:.3f} |")


if __name__ == "__main__":
    main()
