"""Does a prefix of a longer run score like a shorter run at the same counted FLOPs?

    nice -n 10 .venv/bin/python benchmarks/prefix_vs_short.py [--budget 3e11] [--allocs tiny-s:4,tiny-m:8]
        [--seeds 0,1,2] [--schedules constant,cosine] [--problems 200] [--reward rule] [--workers 2] [--out DIR]
        [--json docs/prefix_vs_short.json]

Real runs of RACE's built-in engine with the demo grid's shapes (configs/grid-demo.yaml:
task arith, 16 prompts a step, prompt and completion lengths 64, lr 1e-4, LoRA r16,
reward ``rule``). Per allocation, seed and learning-rate schedule: a LONG run at budget
4B evaluated, through ``eval.at_budgets: [B, 2B]``, where a run of budget B and of 2B
would stop (the last step whose bound fits: the guard's own rule), and SHORT runs at B
and 2B with the same seed and settings. Compared at equal counted FLOPs: the prefix's
per-problem greedy outcomes minus the short run's, paired over seeds x the same
evaluation problems, with a 95% paired bootstrap interval (problems resampled with one
weight vector shared by every comparison, seeds resampled within each). The table also
shows the gap between the allocations at each budget (the differences a nested pilot
must not blur) and the counted FLOPs of prefix and short run side by side.

``constant``: the engine's default schedule (``lr_scheduler_type: constant``).
``cosine``: ``lr_scheduler_type: cosine``, whose length is the steps the run's OWN budget
buys, so the short run anneals to 0 by its end while the long run's prefix is still at
a high learning rate: what real users run, and not a prefix.

Runs are resumable (a finished run directory is read back, not retrained); step-0
evaluations are shared across runs of one base (``eval_cache_dir``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

warnings.filterwarnings("ignore")

BASE = dict(task={"name": "arith"}, prompts_per_step=16, max_prompt_length=64, max_completion_length=64,
            learning_rate=1e-4, lora={"r": 16, "lora_alpha": 16}, reward="rule", torch_threads=1)


def _spec(model: str, G: int, seed: int, schedule: str, budget: float, at: list[float], problems: int,
          cache: str, reward: str = "rule") -> dict:
    return {**BASE, "reward": reward, "model": model, "num_generations": G, "seed": seed, "lr_scheduler_type": schedule,
            "budget_flops": budget, "eval_cache_dir": cache,
            "eval": {"targets": ["greedy"], "n_problems": problems, "n_hard_problems": 0, "n_pass_problems": 0,
                     "num_points": 1, "at_budgets": at}}


def _run(spec: dict, run_dir: str) -> dict:
    os.environ["OMP_NUM_THREADS"] = "1"
    from race.engines import run_engine
    from race.grid.cell import quiet_transformers, set_threads
    from race.spec.run import run_config_from_dict

    set_threads(1, preload_torch=True)
    quiet_transformers()
    t0 = time.time()
    out = run_engine(run_config_from_dict({**spec, "output_dir": run_dir}), run_dir)
    return {"run": out, "wall": time.time() - t0}


def _evals(run_dir: Path) -> dict[int, list[float]]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["per_problem"] for r in rows if r["kind"] == "eval" and r["target"] == "greedy"}


def paired_interval(diffs, n_boot: int = 4000, seed: int = 0):
    """Mean of ``diffs`` (seeds x problems) and its 95% paired bootstrap interval: one
    multinomial weight vector over problems per replicate (shared by every seed), seeds
    resampled with replacement. Percentile interval."""
    import numpy as np

    d = np.asarray(diffs, dtype=float)
    rng = np.random.default_rng(seed)
    S, P = d.shape
    w = rng.multinomial(P, np.full(P, 1.0 / P), size=n_boot) / P  # (R, P)
    k = rng.multinomial(S, np.full(S, 1.0 / S), size=n_boot) / S  # (R, S)
    reps = np.einsum("rs,sp,rp->r", k, d, w)
    lo, hi = np.quantile(reps, [0.025, 0.975])
    return float(d.mean()), float(lo), float(hi)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=float, default=3e11, help="B: short runs at B and 2B, the long run at 4B")
    ap.add_argument("--allocs", default="tiny-s:4,tiny-m:8", help="model:G pairs")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--schedules", default="constant,cosine")
    ap.add_argument("--problems", type=int, default=200)
    ap.add_argument("--reward", default="rule", help="the demo grid's rule; rule:partial (denser credit) learns more")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="/tmp/race-prefix-vs-short")
    ap.add_argument("--json", default=None, help="also write the summary here (e.g. docs/prefix_vs_short.json)")
    a = ap.parse_args(argv)
    import numpy as np

    B = a.budget
    allocs = [(m, int(g)) for m, g in (x.split(":") for x in a.allocs.split(","))]
    seeds = [int(s) for s in a.seeds.split(",")]
    schedules = a.schedules.split(",")
    out = Path(a.out)
    cache = str(out / "eval-cache")
    jobs: dict[tuple, tuple[dict, str]] = {}
    for sch in schedules:
        for m, G in allocs:
            for s in seeds:
                key = (sch, m, G, s)
                jobs[key + ("long",)] = (_spec(m, G, s, sch, 4 * B, [B, 2 * B], a.problems, cache, a.reward),
                                         str(out / f"{sch}-{m}-G{G}-s{s}-long"))
                for mult in (1, 2):
                    jobs[key + (f"short{mult}",)] = (_spec(m, G, s, sch, mult * B, [], a.problems, cache, a.reward),
                                                     str(out / f"{sch}-{m}-G{G}-s{s}-short{mult}"))
    t0 = time.time()
    # longest first: the long runs set the wall time
    order = sorted(jobs, key=lambda k: {"long": 0, "short2": 1, "short1": 2}[k[-1]])
    with ProcessPoolExecutor(max_workers=a.workers) as ex:
        futs = {k: ex.submit(_run, *jobs[k]) for k in order}
        res = {k: f.result() for k, f in futs.items()}
    wall = time.time() - t0

    rows, summary = [], {"command": "python benchmarks/prefix_vs_short.py " + " ".join(argv or sys.argv[1:]),
                         "budget_B": B, "problems": a.problems, "reward": a.reward, "seeds": seeds, "target": "greedy",
                         "wall_s": round(wall, 1), "comparisons": []}
    scores: dict[tuple, float] = {}
    pooled: dict[str, list] = {sch: [] for sch in schedules}
    for sch in schedules:
        for m, G in allocs:
            for mult in (1, 2):
                b = mult * B
                diffs, pre_s, sh_s, f_ratio, same_step = [], [], [], [], 0
                for s in seeds:
                    long = res[(sch, m, G, s, "long")]["run"]
                    short = res[(sch, m, G, s, f"short{mult}")]["run"]
                    point = next(p for p in long["budget_points"] if p["budget"] == b)
                    pre = np.asarray(_evals(Path(jobs[(sch, m, G, s, "long")][1]))[point["step"]], float)
                    sh = np.asarray(_evals(Path(jobs[(sch, m, G, s, f"short{mult}")][1]))[short["steps"]], float)
                    diffs.append(pre - sh)
                    pre_s.append(pre.mean()), sh_s.append(sh.mean())
                    f_ratio.append(point["flops"] / short["total_flops"])
                    same_step += point["step"] == short["steps"]
                pooled[sch].extend(diffs)
                mean, lo, hi = paired_interval(np.vstack(diffs))
                identical = float(np.mean([np.all(d == 0) for d in diffs]))
                gain = float(np.mean([res[(sch, m, G, s, f"short{mult}")]["run"]["final"]["greedy"]
                                      - res[(sch, m, G, s, f"short{mult}")]["run"]["initial"]["greedy"]
                                      for s in seeds]))
                scores[(sch, m, G, mult)] = float(np.mean(sh_s))
                c = {"schedule": sch, "allocation": f"{m} G={G}", "budget": b, "prefix": float(np.mean(pre_s)),
                     "short": float(np.mean(sh_s)), "diff": mean, "lo": lo, "hi": hi,
                     "flops_ratio_min": float(min(f_ratio)), "flops_ratio_max": float(max(f_ratio)),
                     "same_step_seeds": same_step, "identical_seeds": identical * len(seeds),
                     "short_gain": gain}
                summary["comparisons"].append(c)
                rows.append(c)
    print(f"prefix of a 4B run vs a run of budget b (B = {B:.3g} FLOPs), greedy accuracy on {a.problems} problems, "
          f"{len(seeds)} seeds; diff = prefix - short, paired over seeds x problems, 95% bootstrap")
    print(f"{'schedule':9s} {'allocation':12s} {'budget':>8s} {'prefix':>7s} {'short':>7s} {'diff':>8s} "
          f"{'95% interval':>18s} {'FLOPs pre/short':>16s} {'same step':>9s} {'identical':>9s}")
    for c in rows:
        print(f"{c['schedule']:9s} {c['allocation']:12s} {c['budget']:8.3g} {c['prefix']:7.3f} {c['short']:7.3f} "
              f"{c['diff']:+8.4f} [{c['lo']:+.4f}, {c['hi']:+.4f}] "
              f"{c['flops_ratio_min']:7.4f}-{c['flops_ratio_max']:.4f} {c['same_step_seeds']:5d}/{len(seeds)} "
              f"{c['identical_seeds']:5.0f}/{len(seeds)}")
    gains = [c["short_gain"] for c in rows]
    summary["short_gain_range"] = [min(gains), max(gains)]
    print(f"short runs' gain over their step-0 score (mean over seeds): {min(gains):+.4f} to {max(gains):+.4f}")
    summary["pooled"] = {}
    for sch, diffs in pooled.items():  # every (allocation, budget, seed) comparison, problems shared
        mean, lo, hi = paired_interval(np.vstack(diffs))
        same = int(sum(np.all(d == 0) for d in diffs))
        summary["pooled"][sch] = {"diff": mean, "lo": lo, "hi": hi, "identical": same, "n": len(diffs)}
        print(f"pooled {sch:9s}: diff {mean:+.4f} [{lo:+.4f}, {hi:+.4f}] over {len(diffs)} (allocation, budget, "
              f"seed) comparisons; identical per-problem outcomes in {same}")
    if len(allocs) >= 2:
        print("gap between allocations (short runs, mean over seeds):")
        gaps = []
        for sch in schedules:
            for mult in (1, 2):
                vals = [scores[(sch, m, G, mult)] for m, G in allocs]
                gap = max(vals) - min(vals)
                gaps.append({"schedule": sch, "budget": mult * B, "gap": gap})
                print(f"  {sch:9s} budget {mult * B:.3g}: {gap:.4f}")
        summary["allocation_gaps"] = gaps
    run_secs = sum(r["run"].get("wall_s") or 0.0 for r in res.values())
    summary["runs_wall_s"] = round(run_secs, 1)
    print(f"wall {wall:.0f} s for {len(jobs)} runs ({a.workers} workers x 1 thread; runs already finished in --out are "
          f"read back, not retrained); the runs' own wall seconds add up to {run_secs:.0f} s")
    if a.json:
        Path(a.json).write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
