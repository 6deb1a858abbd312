"""Flat and racing pilot designs on the same known worlds, at their pilot compute: regret, late
crossovers, the pick's interval, and the compute the target run does not reuse.

    python benchmarks/race_designs.py --generator tune --first 1000 --worlds 300 --jobs 1   # design / tuning
    python benchmarks/race_designs.py --generator test --first 20000 --worlds 1200 --walk 0.5 --save out.json
    python benchmarks/race_designs.py --load a.json b.json --plot cost_quality.png             # tables again

Per world (learning worlds only: a null world has no regret to measure) of the tuning
generator (``race.analysis.synthetic.random_world``) or the test generator
(``race.analysis.synthetic_rl.rl_world``), optionally with seed offsets that wander along a
trajectory (``--walk L``: a mean-reverting random walk in ln C, correlation exp(-|d ln C| / L),
``World.seed_walk``) instead of staying fixed:

- ``flat``: today's flat grid at a constant learning rate (``world_tables(.., "flat-trajectory")``:
  every budget x seed a run, 4-16x below the target), its observed winner at the largest pilot
  (the naive rule every other design is paired against), and with ``--today`` RACE's
  recommendation on it;
- ``nested``: today's nested grid (one run per allocation and seed at the largest budget), its
  observed winner;
- racing designs without analysis (``keep-all ...``: every allocation continues to the last
  rung, the observed leader there is the pick) and with the racing rule (``race ...``:
  ``race.analysis.synthetic_race.simulate_race`` calls ``race.analysis.racing.rung_decision`` after
  each rung and ``race_pick`` after the last, the code a racing study runs).

Compute in units of the target budget T: ``pilot`` (every pilot FLOP; a continued run counts
its final budget once), ``reused`` (the chosen allocation's longest run, which the target run
continues at a constant learning rate), ``unreused`` = pilot - reused. Regret: the true best
allocation's score at T minus the pick's. ``late``: worlds whose best allocation at T differs
from the best at the flat grid's largest pilot (``crossover_class == "after"``). Every
difference is paired (the same worlds) with a 95% world-bootstrap interval. The cost-quality
figure (``--plot``) draws mean regret against mean pilot compute / T per design.
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

# the racing design (rungs as fractions of T, first-rung seeds), frozen with the rule RacingRule() on the tuning generator
from race.analysis.racing import RACE_FIRST_SEEDS, RACE_RUNGS

HERE = Path(__file__).resolve()
RIGHT = 0.01
#: racing designs run without analysis: (name, rungs as fractions of T, seeds on the first rung: None = the world's)
KEEP_ALL = (("keep-all T/64,T/16,T/4", (1 / 64, 1 / 16, 1 / 4), None),
            ("keep-all T/32,T/8,T/3", (1 / 32, 1 / 8, 1 / 3), None),
            ("1 seed, every allocation to T/4", (1 / 16, 1 / 4), 1))


def make_world(generator: str, seed: int, walk: float = 0.0):
    from race.analysis.synthetic import crossover_class, random_world
    from race.analysis.synthetic_rl import rl_world

    w = random_world(seed) if generator == "tune" else rl_world(seed)
    w.seed_walk = float(walk)
    w.tags["crossover"] = crossover_class(w)
    return w


def short(key: str) -> str:
    return "|".join(str(key).split("|")[:2])


def rule_from(args_rule: str | None):
    from race.analysis.racing import RacingRule

    return RacingRule(**json.loads(args_rule)) if args_rule else RacingRule()


def world_record(generator: str, seed: int, walk: float = 0.0, today: bool = False, rule_json: str | None = None,
                 rungs: tuple[float, ...] = RACE_RUNGS, first_seeds: int | None = RACE_FIRST_SEEDS) -> dict | None:
    """One learning world's record (None for a null world)."""
    from race.analysis import recommend
    from race.analysis.synthetic import world_tables
    from race.analysis.synthetic_race import RaceDesign, observed_leader, simulate_race

    w = make_world(generator, seed, walk)
    if w.tags.get("flat"):
        return None
    T = w.target_budget
    t0 = time.perf_counter()
    truth = {f"{a['model']}|G={a['num_generations']}": w.truth(k) for k, a in enumerate(w.allocations)}
    K, S = len(w.allocations), len(w.seeds)
    rec = {"seed": seed, "generator": generator, "walk": walk, "truth": truth, "crossover": w.tags["crossover"],
           "designs": {}}
    runs, evals = world_tables(w, "flat-trajectory")
    b3 = max(w.budgets)
    flat = {"pick": short(observed_leader(runs, evals, b3)), "pilot": K * S * sum(w.budgets) / T, "reused": b3 / T}
    rec["designs"]["flat"] = flat
    if today:
        r = recommend(evals, runs, "greedy", T)
        rec["designs"]["flat, RACE today"] = {**flat, "pick": short(r.allocation), "lo": r.predicted_lo,
                                              "hi": r.predicted_hi}
    runs, evals = world_tables(w, "nested")
    rec["designs"]["nested"] = {"pick": short(observed_leader(runs, evals, b3)), "pilot": K * S * b3 / T,
                                "reused": b3 / T}
    for name, fr, first in KEEP_ALL:
        out = simulate_race(w, RaceDesign(rungs=fr, first_seeds=first), None)
        rec["designs"][name] = {"pick": short(out["leader"]), "pilot": out["pilot_T"], "reused": out["reused_T"]}
    rule = rule_from(rule_json)
    out = simulate_race(w, RaceDesign(rungs=rungs, first_seeds=first_seeds), rule)
    p = out["pick"]
    rec["designs"]["race"] = {"pick": short(p.allocation), "pilot": out["pilot_T"], "reused": out["reused_T"],
                              "lo": p.predicted_lo, "hi": p.predicted_hi, "p_best": p.win_probability,
                              "p_near_best": p.p_near_best, "confidence": str(p.confidence),
                              "calibration": p.calibration, "alive": out["alive"],
                              "leader": short(out["leader"])}
    rec["rule"] = rule.as_dict()
    rec["rungs"] = list(rungs)
    rec["first_seeds"] = first_seeds
    rec["seconds"] = time.perf_counter() - t0
    return rec


# ---------------------------------------------------------------- scoring
def regret(r: dict, pick: str) -> float:
    return max(r["truth"].values()) - r["truth"][pick]


def paired_interval(d: np.ndarray, n_boot: int = 4000, seed: int = 0) -> tuple[float, float]:
    """95% world-bootstrap percentile interval of mean(d) (d: per-world paired differences)."""
    return ratio_interval(np.asarray(d, dtype=float), np.ones(len(d)), n_boot, seed)


def ratio_interval(num: np.ndarray, den: np.ndarray, n_boot: int = 4000, seed: int = 1) -> tuple[float, float]:
    """95% world-bootstrap interval of sum(num) / sum(den) (paired: the same worlds resampled)."""
    if len(num) == 0:
        return float("nan"), float("nan")
    idx = np.random.default_rng(seed).integers(0, len(num), size=(n_boot, len(num)))
    r = num[idx].sum(axis=1) / np.maximum(den[idx].sum(axis=1), 1e-12)
    return float(np.quantile(r, 0.025)), float(np.quantile(r, 0.975))


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return float("nan"), float("nan")
    p, den = k / n, 1 + z * z / n
    mid, half = (p + z * z / (2 * n)) / den, z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return float(mid - half), float(mid + half)


def design_rows(records: list[dict]) -> list[dict]:
    """Per design: regret, paired differences with the flat grid's observed winner, late crossovers, compute."""
    names = list(records[0]["designs"]) if records else []
    base = np.array([regret(r, r["designs"]["flat"]["pick"]) for r in records])
    late = np.array([r["crossover"] == "after" for r in records])
    rows = []
    for name in names:
        have = [r for r in records if name in r["designs"]]
        if len(have) != len(records):
            continue
        reg = np.array([regret(r, r["designs"][name]["pick"]) for r in records])
        pilot = np.array([r["designs"][name]["pilot"] for r in records])
        reused = np.array([r["designs"][name]["reused"] for r in records])
        d = reg - base
        row = {"design": name, "worlds": len(records), "regret": float(reg.mean()), "diff": float(d.mean()),
               "diff_ci": paired_interval(d), "right": float(np.mean(reg <= RIGHT)), "late_n": int(late.sum()),
               "late_regret": float(reg[late].mean()) if late.any() else float("nan"),
               "late_ratio": float(reg[late].sum() / max(base[late].sum(), 1e-12)) if late.any() else float("nan"),
               "late_ratio_ci": ratio_interval(reg[late], base[late]),
               "pilot_mean": float(pilot.mean()), "pilot_median": float(np.median(pilot)),
               "unreused_mean": float((pilot - reused).mean()), "unreused_max": float((pilot - reused).max()),
               "reused_mean": float(reused.mean())}
        iv = [r["designs"][name] for r in records if "lo" in r["designs"][name]]
        if iv:
            pick = [r["truth"][r["designs"][name]["pick"]] for r in records if "lo" in r["designs"][name]]
            lo, hi, y = (np.array([v["lo"] for v in iv]), np.array([v["hi"] for v in iv]), np.array(pick))
            k = int(np.sum((lo <= y) & (y <= hi)))
            row.update(coverage=k / len(y), coverage_ci=wilson(k, len(y)), width=float(np.median(hi - lo)),
                       below=float(np.mean(y < lo)), above=float(np.mean(y > hi)))
        rows.append(row)
    return rows


def table(records: list[dict], title: str) -> str:
    out = [f"## {title}: {len(records)} learning worlds, {sum(r['crossover'] == 'after' for r in records)} with the "
           "crossover after the flat grid's last pilot", "",
           "| design | pilots / T (mean, median) | not reused / T (mean, max) | mean regret | - flat observed winner [95% paired] "
           "| right (<= 0.01) | late regret | late / flat [95%] | pick's 95% interval: coverage [Wilson], median width |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in design_rows(records):
        cov = (f"{r['coverage']:.1%} [{r['coverage_ci'][0]:.3f}, {r['coverage_ci'][1]:.3f}], {r['width']:.3f} "
               f"(truth below {r['below']:.1%} / above {r['above']:.1%})" if "coverage" in r else "")
        diff = "" if r["design"] == "flat" else f"{r['diff']:+.4f} [{r['diff_ci'][0]:+.4f}, {r['diff_ci'][1]:+.4f}]"
        late = "" if r["design"] == "flat" else f"{r['late_ratio']:.2f} [{r['late_ratio_ci'][0]:.2f}, {r['late_ratio_ci'][1]:.2f}]"
        out.append(f"| {r['design']} | {r['pilot_mean']:.2f}, {r['pilot_median']:.2f} | {r['unreused_mean']:.2f}, "
                   f"{r['unreused_max']:.2f} | {r['regret']:.4f} | {diff} | {r['right']:.1%} | {r['late_regret']:.4f} | "
                   f"{late} | {cov} |")
    race = [r["designs"]["race"] for r in records if "race" in r["designs"]]
    if race:
        alive = np.array([[len(a) for a in v["alive"]] for v in race])
        cal = {}
        for v in race:
            key = v["calibration"].split(" (")[0] if v["calibration"] else "none"
            cal[key] = cal.get(key, 0) + 1
        out += ["", f"race: allocations alive per rung (mean) {', '.join(f'{x:.2f}' for x in alive.mean(axis=0))}; "
                f"pick = observed leader at the last rung in {np.mean([v['pick'] == v['leader'] for v in race]):.1%}; "
                f"intervals calibrated by: {', '.join(f'{k} {n}' for k, n in sorted(cal.items()))}; "
                f"mean P(regret <= 0.01) of the pick {np.mean([v['p_near_best'] for v in race]):.3f} "
                f"(realised {np.mean([regret(r, r['designs']['race']['pick']) <= RIGHT for r in records]):.3f})"]
    return "\n".join(out)


def plot(groups: dict[str, list[dict]], path: str) -> None:
    """Cost-quality curve: mean regret against mean pilot compute / T, one point per design, one panel per group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(groups), figsize=(5.5 * len(groups), 4.5), squeeze=False)
    for ax, (title, records) in zip(axes[0], groups.items()):
        for r in design_rows(records):
            lo, hi = r["diff_ci"]
            ax.errorbar(r["pilot_mean"], r["regret"], yerr=[[r["diff"] - lo], [hi - r["diff"]]],
                        fmt="o" if r["design"] in ("flat", "nested") else ("s" if r["design"] == "race" else "^"),
                        capsize=3, label=r["design"])
        ax.set_xlabel("pilot compute / T (mean)")
        ax.set_ylabel("mean regret at T")
        ax.set_title(f"{title} ({len(records)} worlds)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.text(0.01, 0.01, "error bars: paired 95% interval of the difference from the flat grid's observed winner",
             fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# ---------------------------------------------------------------- running
def shard(args: argparse.Namespace) -> None:
    out = []
    for seed in range(args.first + args.shard, args.first + args.worlds, args.jobs):
        r = world_record(args.generator, seed, args.walk, args.today, args.rule, tuple(args.rungs), args.first_seeds)
        if r is not None:
            out.append(r)
        Path(args.out).write_text(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--generator", choices=("tune", "test"), default="tune")
    ap.add_argument("--first", type=int, default=1000)
    ap.add_argument("--worlds", type=int, default=100, help="world seeds to draw (null worlds are skipped)")
    ap.add_argument("--walk", type=float, default=0.0, help="seed offsets wander along a trajectory (correlation "
                    "length in ln C; 0: fixed)")
    ap.add_argument("--today", action="store_true", help="also RACE's recommendation on the flat grid")
    ap.add_argument("--rule", help="RacingRule fields as JSON (default: the frozen rule)")
    ap.add_argument("--rungs", type=float, nargs="+", default=list(RACE_RUNGS), help="the racing rule's rungs (fractions of T)")
    ap.add_argument("--first-seeds", type=int, default=RACE_FIRST_SEEDS,
                    help="seeds on the racing rule's first rung (default: the frozen design's)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--save", help="write the per-world records here (JSON)")
    ap.add_argument("--load", nargs="+", help="summarise saved records instead of running")
    ap.add_argument("--plot", help="draw the cost-quality figure here (PNG)")
    ap.add_argument("--shard", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.shard is not None:
        return shard(args)
    t0 = time.time()
    if args.load:
        groups = {Path(p).stem: json.loads(Path(p).read_text()) for p in args.load}
    else:
        with tempfile.TemporaryDirectory(prefix="race-designs-") as tmp:
            env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
            outs, procs = [], []
            for i in range(args.jobs):
                outs.append(Path(tmp) / f"shard{i}.json")
                cmd = [sys.executable, str(HERE), "--generator", args.generator, "--first", str(args.first),
                       "--worlds", str(args.worlds), "--walk", repr(args.walk), "--jobs", str(args.jobs),
                       "--shard", str(i), "--out", str(outs[-1]), "--rungs", *map(repr, args.rungs)]
                cmd += ["--first-seeds", str(args.first_seeds)] if args.first_seeds is not None else []
                cmd += ["--today"] if args.today else []
                cmd += ["--rule", args.rule] if args.rule else []
                procs.append(subprocess.Popen(cmd, env=env))
            if any(p.wait() for p in procs):
                sys.exit("a shard failed")
            records = sorted((r for o in outs for r in json.loads(o.read_text())), key=lambda r: r["seed"])
        if args.save:
            Path(args.save).write_text(json.dumps(records))
        title = f"{args.generator} generator" + (f", seed offsets wander (walk {args.walk:g})" if args.walk else "")
        groups = {title: records}
        print(f"# command: python benchmarks/race_designs.py --generator {args.generator} --first {args.first} "
              f"--worlds {args.worlds} --walk {args.walk:g} --jobs {args.jobs}" + (" --today" if args.today else "")
              + (f" --rule '{args.rule}'" if args.rule else "") + f" --rungs {' '.join(f'{x:.6g}' for x in args.rungs)}"
              + (f" --first-seeds {args.first_seeds}" if args.first_seeds is not None else ""))
        print(f"# rule: {records[0]['rule'] if records else '-'}")
    for title, records in groups.items():
        print(table(records, title))
        print()
    if args.plot:
        plot(groups, args.plot)
        print(f"cost-quality figure: {args.plot}")
    print(f"wall time: {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
