"""Does more information per study narrow the forecast? Pilot designs compared on the SAME worlds.

    python benchmarks/decision_quality.py --generator test --worlds 1000 --first 0 --design flat --save /tmp/flat.json
    python benchmarks/decision_quality.py --generator test --worlds 1000 --first 0 --design nested --save /tmp/nested.json
    python benchmarks/design_information.py flat=/tmp/flat.json nested=/tmp/nested.json [more=...]

Each argument is ``name=path`` of records saved by ``benchmarks/decision_quality.py --save``
(the first is the reference). The worlds (seeds) must be the same in every file: the
comparison is paired. Printed side by side per design, with the paired 95% world-bootstrap
interval of each design minus the reference (the same resampled worlds for both):

- pilot compute relative to the reference (mean over worlds) and seeds per allocation (median);
- mean regret of RACE's pick in learning worlds, and of the observed winner at the largest
  pilot (the naive rule sees the same pilots);
- in worlds whose crossover falls after the last pilot: RACE's regret over the observed
  winner's (sum over sum; the issue's done-when asks <= 0.5);
- switches away from the observed winner at the largest pilot (learning worlds);
- the chosen allocation's 95% interval where a forecast was made: coverage, median width,
  and the known-truth forecast error |score - truth| (mean);
- every forecast allocation: coverage and mean |score - truth|.

    python benchmarks/design_information.py --parts flat,nested --generator test --worlds 60

splits the interval's logit-scale SD into its two parts per design (the learning worlds of
the first ``--worlds`` seeds): the spread of the joint replicates (seeds, problems, refits)
and the back-tested extrapolation noise at the target's reach, with the back-test's own
scales and its number of (origin, budget) pairs (``race.analysis.forecast.forecast_parts``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

N_BOOT = 2000


def per_world(records: list[dict]) -> dict[str, np.ndarray]:
    """Per-world values (NaN where a quantity does not apply), in seed order."""
    from race.analysis import Label

    records = sorted(records, key=lambda r: r["seed"])
    out: dict[str, list] = {k: [] for k in ("seed", "learning", "late", "regret", "regret_obs", "switched", "made",
                                            "covered", "width", "abs_err", "all_cov", "all_err", "all_n", "compute",
                                            "seeds")}
    for r in records:
        truth = r["truth"]
        best = max(truth.values())
        obs = max(r["params"], key=lambda k: (r["observed"].get(k, -1.0), k))  # decision_quality.naive_picks' rule
        made = r["confidence"] != Label.NO_LEARNING
        ch = next((p for p in r["predictions"] if p["allocation"] == r["chosen"]), None) if made else None
        preds = r["predictions"] if made else []
        out["seed"].append(r["seed"])
        out["learning"].append(not r["tags"]["flat"])
        out["late"].append(not r["tags"]["flat"] and r["tags"].get("crossover") == "after")
        out["regret"].append(best - truth[r["chosen"]])
        out["regret_obs"].append(best - truth[obs])
        out["switched"].append(r["chosen"] != obs)
        out["made"].append(ch is not None)
        out["covered"].append(float(ch["lo"] <= ch["truth"] <= ch["hi"]) if ch else np.nan)
        out["width"].append(ch["hi"] - ch["lo"] if ch else np.nan)
        out["abs_err"].append(abs(ch["score"] - ch["truth"]) if ch else np.nan)
        out["all_cov"].append(sum(p["lo"] <= p["truth"] <= p["hi"] for p in preds))
        out["all_err"].append(sum(abs(p["score"] - p["truth"]) for p in preds))
        out["all_n"].append(len(preds))
        out["compute"].append(r.get("pilot_compute", np.nan))
        out["seeds"].append(r["n_seeds"])
    return {k: np.asarray(v, dtype=float) for k, v in out.items()}


def statistics(v: dict[str, np.ndarray], ref: dict[str, np.ndarray], idx: np.ndarray) -> dict[str, float]:
    """The compared quantities on the worlds ``idx`` (with repeats: a bootstrap resample)."""
    g = {k: a[idx] for k, a in v.items()}
    learn, late, made = g["learning"] > 0, g["late"] > 0, ~np.isnan(g["width"])
    obs_late = g["regret_obs"][late].sum()
    return {
        "pilot compute / reference": float(np.mean(g["compute"] / ref["compute"][idx])),
        "seeds per allocation (median)": float(np.median(g["seeds"])),
        "mean regret, learning worlds": float(g["regret"][learn].mean()),
        "observed winner's mean regret, learning worlds": float(g["regret_obs"][learn].mean()),
        "late crossover: RACE / observed winner": float(g["regret"][late].sum() / obs_late) if obs_late > 0 else np.nan,
        "late crossover: mean regret": float(g["regret"][late].mean()) if late.any() else np.nan,
        "switches from the observed winner": float(g["switched"][learn].sum()),
        "chosen 95% interval: coverage": float(np.mean(g["covered"][made])),
        "chosen 95% interval: median width": float(np.median(g["width"][made])),
        "chosen forecast: mean abs(score - truth)": float(np.mean(g["abs_err"][made])),
        "every forecast: coverage": float(g["all_cov"].sum() / max(g["all_n"].sum(), 1)),
        "every forecast: mean abs(score - truth)": float(g["all_err"].sum() / max(g["all_n"].sum(), 1)),
    }


def compare(designs: dict[str, list[dict]], n_boot: int = N_BOOT, seed: int = 0) -> tuple[dict, dict]:
    """(point statistics per design, paired 95% intervals of design minus the first design)."""
    vals = {name: per_world(recs) for name, recs in designs.items()}
    names = list(vals)
    ref = vals[names[0]]
    for name in names[1:]:
        if not np.array_equal(vals[name]["seed"], ref["seed"]):
            raise ValueError(f"design {name!r} was run on other worlds than {names[0]!r}: the comparison is paired, "
                             "run every design with the same --generator/--first/--worlds")
    n = len(ref["seed"])
    every = np.arange(n)
    point = {name: statistics(vals[name], ref, every) for name in names}
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    diffs: dict[str, dict[str, list]] = {name: {} for name in names[1:]}
    for b in range(n_boot):
        base = statistics(ref, ref, idx[b])
        for name in names[1:]:
            s = statistics(vals[name], ref, idx[b])
            for k in s:
                diffs[name].setdefault(k, []).append(s[k] - base[k])
    ci = {name: {k: _interval(np.asarray(d)) for k, d in dd.items()} for name, dd in diffs.items()}
    return point, ci


def _interval(d: np.ndarray) -> tuple[float, float]:
    """95% percentile interval of the finite bootstrap differences (NaN when none is)."""
    d = d[np.isfinite(d)]
    return (float(np.quantile(d, 0.025)), float(np.quantile(d, 0.975))) if len(d) else (np.nan, np.nan)


def fmt(key: str, x: float) -> str:
    if "coverage" in key:
        return f"{x:.1%}"
    if "switches" in key or "seeds" in key:
        return f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"
    return f"{x:.3f}" if ("compute" in key or "RACE /" in key or "width" in key) else f"{x:.4f}"


def table(point: dict, ci: dict) -> str:
    names = list(point)
    head = "| quantity | " + " | ".join(names) + " | " + " | ".join(f"{n} - {names[0]} [95% paired]" for n in names[1:])
    lines = [head + " |", "|---|" + "---:|" * (len(names) + len(names) - 1)]
    for key in point[names[0]]:
        cells = [fmt(key, point[n][key]) for n in names]
        d = []
        for n in names[1:]:
            diff, (lo, hi) = point[n][key] - point[names[0]][key], ci[n][key]
            if "coverage" in key:
                d.append(f"{100 * diff:+.1f} pt [{100 * lo:+.1f}, {100 * hi:+.1f}]")
            elif key.startswith(("pilot compute", "seeds")):
                d.append("")
            elif "switches" in key:
                d.append(f"{diff:+.0f} [{lo:+.0f}, {hi:+.0f}]")
            else:
                d.append(f"{diff:+.4f} [{lo:+.4f}, {hi:+.4f}]")
        lines.append(f"| {key} | " + " | ".join(cells) + " | " + " | ".join(d) + " |")
    return "\n".join(lines)


def width_parts(designs: list[str], generator: str = "test", worlds: int = 60, first: int = 0) -> str:
    """Median per design over learning worlds: (replicate logit SD, back-test noise logit SD at the
    target's reach, s_shared, s_specific, back-test pairs); medians over a world's allocations."""
    from race.analysis.backtest import logit
    from race.analysis.joint import draw_replicates, study_matrix
    from race.analysis.forecast import forecast_parts, spend_share
    from race.analysis.synthetic import random_world, world_tables
    from race.analysis.synthetic_rl import rl_world

    rows = {d: [] for d in designs}
    for seed in range(first, first + worlds):
        w = rl_world(seed) if generator == "test" else random_world(seed)
        if w.tags["flat"]:
            continue
        for d in designs:
            runs, evals = world_tables(w, d)
            sm = study_matrix(evals, runs, "greedy")
            reps = draw_replicates(sm, 200, np.random.default_rng(0))
            allocs = sorted(sm.runs["allocation"].unique())
            _, F0, reach, bt = forecast_parts(sm, reps, allocs, {a: ("joint",) for a in allocs},
                                              w.target_budget * spend_share(sm), np.random.default_rng(0))
            rows[d].append((np.median(np.std(logit(F0), axis=0)), np.median(bt.sd(reach)), bt.s_shared, bt.s_specific,
                            bt.n_pairs))
    out = ["| design | learning worlds | replicate logit SD | back-test noise logit SD | s_shared | s_specific | "
           "back-test pairs |", "|---|---:|---:|---:|---:|---:|---:|"]
    for d in designs:
        m = np.median(np.array(rows[d]), axis=0)
        out.append(f"| {d} | {len(rows[d])} | {m[0]:.3f} | {m[1]:.3f} | {m[2]:.3f} | {m[3]:.3f} | {m[4]:.1f} |")
    return "\n".join(out)


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--parts":
        import argparse
        ap = argparse.ArgumentParser()
        ap.add_argument("--parts", required=True)
        ap.add_argument("--generator", choices=("tune", "test"), default="test")
        ap.add_argument("--worlds", type=int, default=60)
        ap.add_argument("--first", type=int, default=0)
        a = ap.parse_args(argv)
        print(f"# interval parts, {a.generator} generator, seeds {a.first}..{a.first + a.worlds - 1} (medians)")
        print(width_parts(a.parts.split(","), a.generator, a.worlds, a.first))
        return
    if len(argv) < 2 or any("=" not in a for a in argv):
        sys.exit("usage: design_information.py NAME=RECORDS.json NAME=RECORDS.json [...] (the first is the reference)")
    designs = {a.split("=", 1)[0]: json.loads(Path(a.split("=", 1)[1]).read_text()) for a in argv}
    point, ci = compare(designs)
    first = next(iter(designs.values()))
    learn = sum(not r["tags"]["flat"] for r in first)
    late = sum((not r["tags"]["flat"]) and r["tags"].get("crossover") == "after" for r in first)
    print(f"# {len(first)} worlds (learning {learn}, crossover after the last pilot {late}), seeds "
          f"{min(r['seed'] for r in first)}..{max(r['seed'] for r in first)}; paired world bootstrap, {N_BOOT} draws")
    print(table(point, ci))


if __name__ == "__main__":
    main(sys.argv[1:])
