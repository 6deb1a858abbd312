"""How good are RACE's calls? The real pipeline on known worlds.

    python benchmarks/decision_quality.py                 # 200 worlds, 2 processes, ~10 min on 2 cores
    python benchmarks/decision_quality.py --worlds 20 --jobs 1 --keep /tmp/dq   # a quick look

For each world (``race.analysis.synthetic.random_world``: 2 sizes x 2 group sizes, curves
from sigmoid / power-law / log-linear / Weibull / rise-then-decline / flat families, shared
problem difficulty, 2-3 seeds, 3 pilot budgets spanning 4-10x, a target 4-16x beyond the
largest pilot) it runs the grid (``race.grid.run_grid``, local runner, one worker; the cell
function below writes run directories in the documented run format), then the report
(``race.report.build_report``, figures included), and reads the recommendation from the
report's ``report.json``. It prints one table:

- coverage of the nominal 95% forecast interval of every forecast made (truth = the
  population-mean score at the FLOPs a run at the target budget counts), per true family;
- P(best) reliability: Brier score and a 5-bucket reliability table;
- regret of RACE's pick against naive rules (largest model, largest group, most steps =
  smallest model, the observed winner at the largest pilot) and the oracle;
- the share of flat worlds labelled "no learning detected" (target >= 95%), of learning
  worlds labelled so, and how often each confidence label's pick is right (regret <= 0.01).

The label rules were set on other worlds (seeds 1000-1199), not on these (seeds 0-199).
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
MODEL_NAMES = {"small": "tiny-xs", "large": "tiny-s"}  # real tiny shapes, so the grid plan can price the cells
RIGHT = 0.01


# ---------------------------------------------------------------- the cell function (runs in grid workers)
def run_cell(cfg, run_dir):
    """Grid cell function: this world's outcomes for (model, num_generations, budget, seed)."""
    from race.analysis.synthetic import World

    run_dir = Path(run_dir)
    world = World.from_dict(json.loads((run_dir.parents[1] / "world.json").read_text()))
    k = world.index(cfg.model, cfg.num_generations)
    points = world.run_outcomes(k, cfg.budget_flops, cfg.seed)
    with (run_dir / "metrics.jsonl").open("w") as f:
        for step, (c, per) in enumerate(points):
            f.write(json.dumps({"kind": "eval", "step": step * 10, "flops": c, "target": "greedy",
                                "score": float(per.mean()), "n": len(per), "per_problem": per.tolist()}) + "\n")
    total = points[-1][0]
    (run_dir / "ledger.jsonl").write_text(json.dumps({"step": 10 * (len(points) - 1), "phase": "update",
                                                      "component": "synthetic", "flops": total, "tokens": 0,
                                                      "seconds": 0.0, "counted": True}) + "\n")
    run = {"run_id": cfg.run_id(), "name": cfg.name, "engine": "synthetic", "status": "complete",
           "stop_reason": "budget", "budget_flops": cfg.budget_flops, "total_flops": total,
           "phase_flops": {"rollout": 0.7 * total, "update": 0.3 * total}, "steps": 10 * (len(points) - 1),
           "wall_s": 0.0, "phase_seconds": {}, "model_params": world.models[cfg.model],
           "final": {"greedy": float(points[-1][1].mean())}, "initial": {"greedy": float(points[0][1].mean())},
           "diagnostics": {"zero_var_frac": 0.1, "trunc_rate": 0.0}, "config": cfg.model_dump(mode="json")}
    (run_dir / "run.json").write_text(json.dumps(run))
    return run


# ---------------------------------------------------------------- one world through the pipeline
def grid_of(world, n_problems: int) -> dict:
    return {"study": world.name, "budgets": world.budgets, "require_budget_span": False,
            "base": {"prompts_per_step": 4, "max_prompt_length": 16, "max_completion_length": 16,
                     "learning_rate": 1e-4, "reward": "rule",
                     "eval": {"n_problems": n_problems, "targets": ["greedy"], "num_points": world.n_points}},
            "axes": {"model": sorted(world.models), "num_generations": [4, 8]}, "seeds": world.seeds,
            "min_steps": 0, "max_retries": 0, "cell_fn": f"{HERE}:run_cell",
            "runner": {"kind": "local", "workers": 1, "threads_per_worker": 1, "preload_torch": False}}


def run_world(seed: int, root: Path, n_boot_fit: int) -> dict:
    from race.analysis.synthetic import random_world
    from race.grid import run_grid
    from race.report import build_report

    w = random_world(seed)
    w.models = {MODEL_NAMES[m]: p for m, p in w.models.items()}
    for a in w.allocations:
        a["model"] = MODEL_NAMES[a["model"]]
    study = root / w.name
    study.mkdir(parents=True, exist_ok=True)
    (study / "world.json").write_text(json.dumps(w.to_dict()))
    t0 = time.perf_counter()
    res = run_grid(grid_of(w, w.n_problems), study)
    t_grid = time.perf_counter() - t0
    paths = build_report(study, target_budget=w.target_budget, targets=("greedy",), n_boot=200,
                         n_boot_fit=n_boot_fit)
    t_report = time.perf_counter() - t0 - t_grid
    rec = json.loads(paths.json.read_text())["sections"]["recommendation"]["data"]["recommendation"]
    truth = {}
    for k, a in enumerate(w.allocations):
        truth[f"{a['model']}|G={a['num_generations']}"] = w.truth(k)
    preds = []
    for p in rec["predictions"]:
        short = "|".join(p["allocation"].split("|")[:2])
        preds.append({"allocation": short, "score": p["score"], "lo": p["lo"], "hi": p["hi"], "p_best": p["p_best"],
                      "truth": truth[short]})
    gate = rec["gate"]
    obs = {}
    for g in gate:  # observed equal-FLOP end score at the largest pilot budget
        obs["|".join(g["allocation"].split("|")[:2])] = g["end"]
    return {"seed": seed, "tags": w.tags, "truth": truth, "chosen": "|".join(rec["allocation"].split("|")[:2]),
            "confidence": rec["confidence"], "predictions": preds, "observed": obs, "failed": len(res.failed),
            "params": {f"{a['model']}|G={a['num_generations']}": (w.models[a["model"]], a["num_generations"])
                       for a in w.allocations},
            "seconds": {"grid": t_grid, "report": t_report}}


# ---------------------------------------------------------------- scoring
def naive_picks(r: dict) -> dict[str, str]:
    obs, params = r["observed"], r["params"]

    def best_of(keys):
        return max(keys, key=lambda k: (obs.get(k, -1.0), k))

    largest = max(p[0] for p in params.values())
    smallest = min(p[0] for p in params.values())
    biggest_g = max(p[1] for p in params.values())
    return {"RACE": r["chosen"],
            "largest model": best_of([k for k, p in params.items() if p[0] == largest]),
            "largest group": best_of([k for k, p in params.items() if p[1] == biggest_g]),
            "most steps (smallest model)": best_of([k for k, p in params.items() if p[0] == smallest]),
            "observed winner at largest pilot": best_of(list(params)),
            "oracle": max(r["truth"], key=lambda k: r["truth"][k])}


def summarise(results: list[dict]) -> str:
    out = []
    fc = [(r, p) for r in results if r["confidence"] != "no learning detected" for p in r["predictions"]]
    cov = np.array([p["lo"] <= p["truth"] <= p["hi"] for _, p in fc])
    out.append(f"worlds: {len(results)} (flat {sum(r['tags']['flat'] for r in results)}); failed cells: "
               f"{sum(r['failed'] for r in results)}")
    out.append("")
    out.append("| forecast coverage (nominal 95%) | forecasts | covered |")
    out.append("|---|---:|---:|")
    out.append(f"| all | {len(cov)} | {cov.mean():.1%} |")
    chosen = np.array([p["allocation"] == r["chosen"] for r, p in fc])
    out.append(f"| the recommended allocation | {chosen.sum()} | {cov[chosen].mean():.1%} |")
    fams = sorted({r["tags"]["family"] for r, _ in fc})
    for f in fams:
        m = np.array([r["tags"]["family"] == f for r, _ in fc])
        out.append(f"| world family {f} | {m.sum()} | {cov[m].mean():.1%} |")
    out.append("")
    pb = np.array([p["p_best"] for _, p in fc])
    best = np.array([p["truth"] >= max(r["truth"].values()) - 1e-12 for r, p in fc])
    out.append(f"P(best) Brier score: {np.mean((pb - best) ** 2):.3f} (forecast worlds; always-0.5 would score "
               f"{np.mean((0.5 - best) ** 2):.3f})")
    out.append("")
    out.append("| P(best) bucket | n | mean P(best) | truly best |")
    out.append("|---|---:|---:|---:|")
    for lo, hi in [(0, .2), (.2, .4), (.4, .6), (.6, .8), (.8, 1.0001)]:
        m = (pb >= lo) & (pb < hi)
        if m.any():
            out.append(f"| [{lo:.1f}, {min(hi, 1):.1f}{']' if hi > 1 else ')'} | {m.sum()} | {pb[m].mean():.2f} | "
                       f"{best[m].mean():.2f} |")
    out.append("")
    out.append(f"| rule | mean regret | median | share right (regret <= {RIGHT}) |")
    out.append("|---|---:|---:|---:|")
    learn = [r for r in results if not r["tags"]["flat"]]
    for rule in naive_picks(learn[0]).keys() if learn else []:
        reg = np.array([max(r["truth"].values()) - r["truth"][naive_picks(r)[rule]] for r in learn])
        out.append(f"| {rule} | {reg.mean():.4f} | {np.median(reg):.4f} | {np.mean(reg <= RIGHT):.1%} |")
    out.append("(regret over learning worlds, in score points of the true population mean at the target)")
    out.append("")
    flat = [r for r in results if r["tags"]["flat"]]
    nl_flat = np.mean([r["confidence"] == "no learning detected" for r in flat]) if flat else float("nan")
    nl_learn = np.mean([r["confidence"] == "no learning detected" for r in learn]) if learn else float("nan")
    out.append(f"flat worlds labelled 'no learning detected': {nl_flat:.1%} of {len(flat)} (target >= 95%)")
    out.append(f"learning worlds labelled 'no learning detected': {nl_learn:.1%} of {len(learn)}")
    out.append("")
    out.append("| confidence label | calls | pick right (regret <= 0.01) | mean regret |")
    out.append("|---|---:|---:|---:|")
    for lab in ("stable regime", "unstable", "extrapolation too far", "no learning detected"):
        rs = [r for r in results if r["confidence"] == lab]
        if rs:
            reg = np.array([max(r["truth"].values()) - r["truth"][r["chosen"]] for r in rs])
            out.append(f"| {lab} | {len(rs)} | {np.mean(reg <= RIGHT):.1%} | {reg.mean():.4f} |")
    sec = np.array([[r["seconds"]["grid"], r["seconds"]["report"]] for r in results])
    out.append("")
    out.append(f"seconds per world (median): grid {np.median(sec[:, 0]):.2f}, report {np.median(sec[:, 1]):.2f}")
    return "\n".join(out)


def shard(args: argparse.Namespace) -> None:
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="race-dq-"))
    results = []
    for seed in range(args.first + args.shard, args.first + args.worlds, args.jobs):
        results.append(run_world(seed, root, args.n_boot_fit))
        print(f"[shard {args.shard}] world {seed} done", file=sys.stderr, flush=True)
    Path(args.out).write_text(json.dumps(results))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", type=int, default=200)
    ap.add_argument("--first", type=int, default=0, help="first world seed (the label rules were set on 1000+)")
    ap.add_argument("--jobs", type=int, default=2, help="processes, each running its share of the worlds")
    ap.add_argument("--n-boot-fit", type=int, default=200)
    ap.add_argument("--keep", help="keep the study directories here (default: a temporary directory)")
    ap.add_argument("--shard", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.shard is not None:
        return shard(args)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="race-dq-") as tmp:
        procs, outs = [], []
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        for i in range(args.jobs):
            out = Path(tmp) / f"shard{i}.json"
            outs.append(out)
            cmd = [sys.executable, str(HERE), "--worlds", str(args.worlds), "--first", str(args.first), "--jobs",
                   str(args.jobs), "--shard", str(i), "--out", str(out), "--n-boot-fit", str(args.n_boot_fit)]
            if args.keep:
                cmd += ["--keep", args.keep]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL))
        codes = [p.wait() for p in procs]
        if any(codes):
            sys.exit(f"a shard failed (exit codes {codes})")
        results = [r for o in outs for r in json.loads(o.read_text())]
    results.sort(key=lambda r: r["seed"])
    print(f"# RACE decision quality: {len(results)} known worlds, seeds {args.first}..{args.first + args.worlds - 1}")
    print(f"# command: python benchmarks/decision_quality.py --worlds {args.worlds} --first {args.first} "
          f"--jobs {args.jobs}")
    print(summarise(results))
    print(f"\nwall time: {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
