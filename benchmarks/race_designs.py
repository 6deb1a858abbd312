"""Racing designs and the literature's baselines on the same known worlds, at equal pilot compute:
regret, the eventual winner alive at the last rung, late crossovers, the pick's interval, cost in T.

    python benchmarks/race_designs.py --generator tune --k 12 --first 1000 --worlds 200 --jobs 2   # tuning
    python benchmarks/race_designs.py --generator steps --k 24 --first 70000 --worlds 200 --save s24.json
    python benchmarks/race_designs.py --load a.json b.json --plot cost_quality.png                 # tables again

Generators by name (``race.analysis.synthetic_worlds.make_world``: the tuning generator ``tune``,
the test generator ``test``, ``steps`` (curves in optimizer steps with warmup and a step cost,
ill-behaved curves, drifting seed effects), with ``--k`` allocations and ``--walk`` (seed offsets
that wander along a run). Null worlds are skipped (nothing to regret). Per world, every design:

- ``flat``: a flat grid (every budget x seed a run, 4-16x below T), its observed winner at the
  largest pilot: the naive rule every other design is paired against;
- ``keep-all``: every allocation, one seed, to the budget the cap buys (``cap T / (K - 1)``,
  at most the last rung), the observed leader there;
- ``top-k``: the default schedule's first rung, then the ``k`` best by observed score straight to
  the last rung (Egele et al., arXiv 2307.15422), ``k`` as many as the cap allows;
- ``halving``: successive halving by observed score over the default schedule's rungs, the
  observed leader at the last rung;
- ``brackets``: a Hyperband-style pair on shared trajectories: bracket A halves from the
  default schedule's first rung to one finalist, bracket B runs every allocation from A's
  middle rung (so it never cuts the largest model before it) to one finalist; the better
  finalist at the last rung by observed score; A's first rung as large as the cap allows;
- ``race (last round)``: the earlier freezes' forecast-gated race (rungs T/64, T/8, T/3, 2 seeds
  first, the cap rule, ``rank="forecast"``);
- ``default`` and any ``--candidates`` (JSON: name -> RacingRule fields, plus ``first_seeds``):
  the racing code a study runs (``simulate_race`` with ``rung_decision``), schedule sized by the
  grid and the cap, its pick with an interval and P(best) over every allocation.

Compute in units of T: ``pilot`` (every pilot FLOP; a continued run counts its final budget
once), ``reused`` (the pick's continued run), ``unreused = pilot - reused``. Regret: the true
best allocation's score at T minus the pick's. ``alive``: the true best reached the last rung;
``within 0.01 of it alive``: an allocation within 0.01 of the true best at T did (near-ties found).
``late``: worlds whose best allocation at T differs from the best at the flat grid's largest
pilot. Differences are paired (the same worlds) with 95% world-bootstrap intervals.

``--ceiling`` adds a diagnostic row, ``ceiling (noise-free rungs)``: the default's schedule with
every cut ranked by the true scores at the rung budgets (no seed or problem noise) and the true
best at the last rung picked. No design can run it; its winner-alive share is the share of
worlds whose eventual winner leads (is kept) at every rung on that schedule, and its regret is
what crossovers after a cut cost there with perfect measurement. A reference, not a strict
bound: a noisy design can keep a late bloomer by chance. It works on saved records too
(``--load a.json --ceiling``).
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

HERE = Path(__file__).resolve()
RIGHT = 0.01


def make_world(generator: str, seed: int, walk: float = 0.0, k: int = 4):
    from race.analysis.synthetic import crossover_class
    from race.analysis.synthetic_worlds import make_world as build

    w = build(generator, seed, k=k, walk=walk)
    w.tags.setdefault("crossover", crossover_class(w))
    return w


# ---------------------------------------------------------------- designs
def world_record(generator: str, seed: int, walk: float = 0.0, k: int = 4, rule_json: str | None = None,
                 candidates: dict | None = None, baselines: bool = True, skip: tuple[str, ...] = ()) -> dict | None:
    """One learning world's record (None for a null world): every design of
    ``race.analysis.designs.DESIGNS`` and the ``candidates`` on the same trajectories."""
    from race.analysis.designs import DESIGNS, race
    from race.analysis.racing import FIRST_SEEDS, RacingRule
    from race.analysis.synthetic_race import WorldSource

    w = make_world(generator, seed, walk, k)
    if w.tags.get("flat"):
        return None
    t0 = time.perf_counter()
    src = WorldSource(w)
    names = src.names
    rec = {"seed": seed, "generator": generator, "walk": walk, "k": len(names),
           "truth": {n: w.truth(i) for i, n in enumerate(names)}, "crossover": w.tags["crossover"],
           "family": str(w.tags.get("family", "")), "families": {n: _family(w, i) for i, n in enumerate(names)},
           "designs": {}, "seconds": {}}
    base = json.loads(rule_json) if rule_json else {}
    s0 = int(base.pop("first_seeds", FIRST_SEEDS))
    rule = RacingRule(**base)
    for name, design in (DESIGNS.items() if baselines else ()):
        if name in skip:
            continue
        t = time.perf_counter()
        rec["designs"][name] = design(src, rule, min(s0, len(src.seeds))).as_dict()
        rec["seconds"][name] = time.perf_counter() - t
    for name, spec in (candidates or {}).items():
        spec = dict(spec)
        first = int(spec.pop("first_seeds", s0))
        t = time.perf_counter()
        rec["designs"][name] = race(src, RacingRule(**{**rule.as_dict(), **spec}), min(first, len(src.seeds))).as_dict()
        rec["seconds"][name] = time.perf_counter() - t
    rec["rule"] = rule.as_dict()
    rec["total_seconds"] = time.perf_counter() - t0
    return rec


CEILING = "ceiling (noise-free rungs)"


def ceiling_design(w, rule_dict: dict | None = None, first_seeds: int | None = None) -> dict:
    """A diagnostic, not a design anyone can run: the default's schedule (rungs, keep counts, step
    floors, one first-rung seed where two do not fit) with every cut ranked by the allocations'
    *true* mean scores at their rung budgets (``World.truth``: no seed or problem noise) and the
    pick the true best at the last rung. What it loses is what ranking by the current score costs on
    this schedule once curves cross after a cut: its winner-alive share is the share of worlds whose
    eventual winner is among the leaders at every rung. In the others the winner trails at some
    rung, and a design keeps it only by chance (noise that happens to favour it) or by a forecast
    that foresees the crossing. Not a strict bound on a noisy design (chance can keep a late
    bloomer the noise-free ranking cuts; its pick is the best at the last rung, not at T), a
    reference. Compute: the schedule's worst case."""
    from race.analysis.designs import fitting_schedule
    from race.analysis.racing import FIRST_SEEDS, RacingRule
    from race.analysis.synthetic_race import WorldSource

    base = dict(rule_dict or {})
    base.pop("first_seeds", None)
    rule = RacingRule(**base)
    src = WorldSource(w)
    sched = fitting_schedule(src, rule, min(int(first_seeds or FIRST_SEEDS), len(src.seeds)))
    names, last = src.names, len(sched.budgets) - 1
    alive, alive_n = list(range(len(names))), [len(names)]
    for j in range(last):
        true = {k: w.truth(k, sched.budget_of(names[k], j)) for k in alive}
        alive = sorted(alive, key=lambda k: (-true[k], k))[: sched.keep[j + 1]]
        alive_n.append(len(alive))
    pick = max(alive, key=lambda k: (w.truth(k, sched.budget_of(names[k], last)), -k))
    cost = sched.cost()
    return {"pick": names[pick], "pilot": cost["pilots_T"], "reused": cost["reused_T"],
            "alive_last": [names[k] for k in alive], "alive_n": alive_n, "fits": sched.fits(),
            "first_seeds": sched.first_seeds}


def add_ceiling(records: list[dict]) -> list[dict]:
    """:func:`ceiling_design` added to saved records (each world rebuilt from its generator, seed, K and walk)."""
    for r in records:
        w = make_world(r["generator"], r["seed"], r.get("walk", 0.0), r["k"])
        r["designs"][CEILING] = ceiling_design(w, r.get("rule"))
    return records


def _family(w, k: int) -> str:
    a = w.allocations[k]
    c = a.get("curve")
    if isinstance(c, dict):
        return str(c.get("family") or c.get("shape") or c.get("kind") or "")
    if c is not None and hasattr(c, "family"):
        return str(c.family)
    return str(a.get("family", w.tags.get("family", "")))


# ---------------------------------------------------------------- scoring
def regret(r: dict, pick: str) -> float:
    return max(r["truth"].values()) - r["truth"][pick]


def best_of(r: dict) -> str:
    return max(r["truth"], key=lambda a: r["truth"][a])


def near_best_alive(r: dict, alive: list[str], tol: float = RIGHT) -> bool:
    """Whether an allocation within ``tol`` of the best at T (the true best or a near-tie with it)
    reached the last rung: the winner-alive share with near-ties at T counted as found."""
    best = max(r["truth"].values())
    return any(r["truth"][a] >= best - tol for a in alive)


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


def feasible(records: list[dict], design: str = "default") -> list[dict]:
    """Worlds where ``design``'s schedule fits the cap (the others: the plan refuses the grid and says
    what would fit, so a user changes the grid; reported apart)."""
    return [r for r in records if r["designs"].get(design, {}).get("fits", True)]


def design_rows(records: list[dict], against: str = "default") -> list[dict]:
    """Per design: regret, paired differences with the flat grid's observed winner and with
    ``against``, the winner alive at the last rung, late crossovers, compute, the interval."""
    names = list(records[0]["designs"]) if records else []
    base = np.array([regret(r, r["designs"]["flat"]["pick"]) for r in records]) if names and "flat" in names else None
    ref = (np.array([regret(r, r["designs"][against]["pick"]) for r in records])
           if names and all(against in r["designs"] for r in records) else None)
    late = np.array([r["crossover"] == "after" for r in records])
    rows = []
    for name in names:
        if not all(name in r["designs"] for r in records):
            continue
        reg = np.array([regret(r, r["designs"][name]["pick"]) for r in records])
        pilot = np.array([r["designs"][name]["pilot"] for r in records])
        reused = np.array([r["designs"][name]["reused"] for r in records])
        alive = np.array([best_of(r) in r["designs"][name].get("alive_last", []) for r in records])
        near = np.array([near_best_alive(r, r["designs"][name].get("alive_last", [])) for r in records])
        row = {"design": name, "worlds": len(records), "regret": float(reg.mean()), "right": float(np.mean(reg <= RIGHT)),
               "alive": float(alive.mean()), "near_alive": float(near.mean()), "late_n": int(late.sum()),
               "pilot_mean": float(pilot.mean()), "unreused_mean": float((pilot - reused).mean()),
               "unreused_max": float((pilot - reused).max())}
        if base is not None:
            d = reg - base
            row.update(diff=float(d.mean()), diff_ci=paired_interval(d),
                       late_ratio=float(reg[late].sum() / max(base[late].sum(), 1e-12)) if late.any() else float("nan"),
                       late_ratio_ci=ratio_interval(reg[late], base[late]))
        if ref is not None:
            d = reg - ref
            row.update(vs=float(d.mean()), vs_ci=paired_interval(d, seed=2))
        iv = [r for r in records if "lo" in r["designs"][name]]
        if iv:
            lo = np.array([r["designs"][name]["lo"] for r in iv])
            hi = np.array([r["designs"][name]["hi"] for r in iv])
            y = np.array([r["truth"][r["designs"][name]["pick"]] for r in iv])
            k = int(np.sum((lo <= y) & (y <= hi)))
            fam: dict[str, list[bool]] = {}
            for r, ok in zip(iv, (lo <= y) & (y <= hi)):
                fam.setdefault(r["families"].get(r["designs"][name]["pick"], "") or r["family"], []).append(bool(ok))
            row.update(coverage=k / len(y), coverage_ci=wilson(k, len(y)), width=float(np.median(hi - lo)),
                       below=float(np.mean(y < lo)), above=float(np.mean(y > hi)),
                       family_coverage={f: (float(np.mean(v)), len(v)) for f, v in sorted(fam.items())},
                       p_best=float(np.mean([r["designs"][name]["p_best"] for r in iv])),
                       p_best_realised=float(np.mean([regret(r, r["designs"][name]["pick"]) == 0 for r in iv])))
        rows.append(row)
    return rows


def table(records: list[dict], title: str, against: str = "default") -> str:
    refused = len(records) - len(feasible(records, against))
    records = feasible(records, against)
    late = sum(r["crossover"] == "after" for r in records)
    out = [f"## {title}: {len(records)} learning worlds, {late} with the crossover after the flat grid's last pilot"
           + (f" ({refused} more refused by the plan: {against}'s schedule does not fit the cap even with one "
              "first-rung seed)" if refused else ""), "",
           f"| design | pilots / T | not reused / T (mean, max) | mean regret | - flat [95% paired] | - {against} [95% paired] "
           "| right (<= 0.01) | winner alive at last rung | within 0.01 of it alive | late / flat "
           "| pick's interval: coverage, median width | P(best) mean / realised |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in design_rows(records, against):
        diff = "" if r["design"] == "flat" or "diff" not in r else f"{r['diff']:+.4f} [{r['diff_ci'][0]:+.4f}, {r['diff_ci'][1]:+.4f}]"
        vs = "" if r["design"] == against or "vs" not in r else f"{r['vs']:+.4f} [{r['vs_ci'][0]:+.4f}, {r['vs_ci'][1]:+.4f}]"
        lr = "" if r["design"] == "flat" or "late_ratio" not in r else f"{r['late_ratio']:.2f}"
        cov = (f"{r['coverage']:.1%} [{r['coverage_ci'][0]:.3f}, {r['coverage_ci'][1]:.3f}], {r['width']:.3f}"
               if "coverage" in r else "")
        pb = f"{r['p_best']:.2f} / {r['p_best_realised']:.2f}" if "p_best" in r else ""
        out.append(f"| {r['design']} | {r['pilot_mean']:.2f} | {r['unreused_mean']:.2f}, {r['unreused_max']:.2f} | "
                   f"{r['regret']:.4f} | {diff} | {vs} | {r['right']:.1%} | {r['alive']:.1%} | {r['near_alive']:.1%} | {lr} | {cov} "
                   f"| {pb} |")
    fams = [(r["design"], r["family_coverage"]) for r in design_rows(records, against) if "family_coverage" in r]
    for name, fc in fams:
        out.append(f"\n{name}: coverage by the pick's curve family: "
                   + ", ".join(f"{f or '-'} {c:.0%} (n={n})" for f, (c, n) in fc.items()))
    return "\n".join(out)


def plot(groups: dict[str, list[dict]], path: str) -> None:
    """Cost-quality: mean regret against mean pilot compute / T, one point per design, one panel per group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(groups), figsize=(5.0 * len(groups), 4.5), squeeze=False)
    for ax, (title, records) in zip(axes[0], groups.items()):
        for r in design_rows(records):
            lo, hi = r.get("diff_ci", (r["regret"], r["regret"]))
            d = r.get("diff", 0.0)
            ax.errorbar(r["pilot_mean"], r["regret"], yerr=[[d - lo], [hi - d]],
                        fmt="s" if r["design"] == "default" else ("o" if r["design"] == "flat" else "^"),
                        capsize=3, label=r["design"])
        ax.set_xlabel("pilot compute / T (mean)")
        ax.set_ylabel("mean regret at T")
        ax.set_title(f"{title} ({len(records)} worlds)", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.text(0.01, 0.01, "error bars: paired 95% interval of the difference from the flat grid's observed winner",
             fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------- running
def shard(args: argparse.Namespace) -> None:
    cands = json.loads(args.candidates) if args.candidates else None
    out = []
    for seed in range(args.first + args.shard, args.first + args.worlds, args.jobs):
        r = world_record(args.generator, seed, args.walk, args.k, args.rule, cands, not args.no_baselines,
                         tuple(args.skip or ()))
        if r is not None:
            out.append(r)
        Path(args.out).write_text(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--generator", default="tune", help="tune | test | steps (race.analysis.synthetic_worlds)")
    ap.add_argument("--k", type=int, default=4, help="allocations per world (4, 12, 24)")
    ap.add_argument("--first", type=int, default=1000)
    ap.add_argument("--worlds", type=int, default=100, help="world seeds to draw (null worlds are skipped)")
    ap.add_argument("--walk", type=float, default=0.0, help="seed offsets wander along a trajectory (correlation "
                    "length in ln C; 0: fixed)")
    ap.add_argument("--rule", help="the default design: RacingRule fields (+ first_seeds) as JSON (default: frozen)")
    ap.add_argument("--candidates", help="JSON {name: {RacingRule fields, first_seeds}}: more designs to run")
    ap.add_argument("--no-baselines", action="store_true", help="run only --candidates")
    ap.add_argument("--skip", nargs="+", help="designs of race.analysis.designs.DESIGNS to leave out")
    ap.add_argument("--against", default="default", help="the design the paired column compares with")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--save", help="write the per-world records here (JSON)")
    ap.add_argument("--load", nargs="+", help="summarise saved records instead of running")
    ap.add_argument("--plot", help="draw the cost-quality figure here (PNG)")
    ap.add_argument("--ceiling", action="store_true", help="add the noise-free-rungs reference (a diagnostic: "
                    "the default's schedule ranked by the true scores at each rung), to loaded records too")
    ap.add_argument("--shard", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.shard is not None:
        return shard(args)
    t0 = time.time()
    if args.load:
        groups = {Path(p).stem: json.loads(Path(p).read_text()) for p in args.load}
        if args.ceiling:
            groups = {t: add_ceiling(recs) for t, recs in groups.items()}
    else:
        with tempfile.TemporaryDirectory(prefix="race-designs-") as tmp:
            env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
            outs, procs = [], []
            for i in range(args.jobs):
                outs.append(Path(tmp) / f"shard{i}.json")
                cmd = [sys.executable, str(HERE), "--generator", args.generator, "--k", str(args.k), "--first",
                       str(args.first), "--worlds", str(args.worlds), "--walk", repr(args.walk), "--jobs", str(args.jobs),
                       "--shard", str(i), "--out", str(outs[-1])]
                cmd += ["--rule", args.rule] if args.rule else []
                cmd += ["--candidates", args.candidates] if args.candidates else []
                cmd += ["--no-baselines"] if args.no_baselines else []
                cmd += ["--skip", *args.skip] if args.skip else []
                procs.append(subprocess.Popen(cmd, env=env))
            if any(p.wait() for p in procs):
                sys.exit("a shard failed")
            records = sorted((r for o in outs for r in json.loads(o.read_text())), key=lambda r: r["seed"])
        if args.ceiling:
            records = add_ceiling(records)
        if args.save:
            Path(args.save).write_text(json.dumps(records))
        title = f"{args.generator} generator, K={args.k}" + (f", walk {args.walk:g}" if args.walk else "")
        groups = {title: records}
        print(f"# command: python benchmarks/race_designs.py --generator {args.generator} --k {args.k} --first {args.first} "
              f"--worlds {args.worlds} --walk {args.walk:g} --jobs {args.jobs}" + (f" --rule '{args.rule}'" if args.rule else "")
              + (f" --candidates '{args.candidates}'" if args.candidates else "")
              + (" --skip " + " ".join(f"'{x}'" for x in args.skip) if args.skip else ""))
        print(f"# rule: {records[0]['rule'] if records else '-'}")
    against = args.against
    for title, records in groups.items():
        if records and against not in records[0]["designs"]:
            against = next(iter(records[0]["designs"]))
        print(table(records, title, against))
        print()
    if args.plot:
        plot(groups, args.plot)
        print(f"cost-quality figure: {args.plot}")
    print(f"wall time: {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
