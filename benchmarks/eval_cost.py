"""Evaluation cost: the demo's evaluation of each base model, with finished rows dropped
from the decode batch and without, interleaved in one process.

    .venv/bin/python benchmarks/eval_cost.py [--sizes tiny-s,tiny-m,tiny-l] [--rounds 3] [--threads 1]
                                             [--grid src/race/configs/demo.yaml]

Each size's packaged warm start (the demo's bases, LoRA attached as a run does) is
evaluated with the grid's evaluation settings (targets, problems, ``pass_k``,
``max_completion_length``): greedy rows and pass@k rows in one decode loop per batch.
Rounds alternate the two variants; the table gives median seconds, the ratio, the share of
decode row-steps that ran (``decoded`` tokens over rows x longest completion), the FLOPs
charged to ``eval`` by each and the scores (equal: dropping a finished row changes no
token). The last line puts that beside the step-0 sharing (one step-0 evaluation per base
instead of one per cell): the demo's evaluation seconds relative to evaluating every cell
twice without either lever, from the grid plan's runnable cells.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]


def evaluator_for(grid, size: str):
    """A run's evaluator and policy for ``size`` under ``grid``'s base settings."""
    from race.engines.common import load_run_policy, make_task, run_evaluator
    from race.models import wrap_lora

    cell = next(c for c in grid.cells() if c.config.model == size)
    cfg = cell.config
    policy = load_run_policy(cfg)
    model = wrap_lora(policy.model, cfg.lora) if cfg.lora is not None else policy.model
    return run_evaluator(cfg, make_task(cfg, policy.tok), policy), model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", default=str(ROOT / "src" / "race" / "configs" / "demo.yaml"))
    ap.add_argument("--sizes", default="tiny-s,tiny-m,tiny-l")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    import torch

    from race.grid import load_grid_spec
    from race.grid.plan import plan_grid

    torch.set_num_threads(a.threads)
    plan = plan_grid(load_grid_spec(a.grid))
    grid = plan.spec
    print(f"$ {' '.join([Path(sys.executable).name] + sys.argv)}")
    print(f"torch {torch.__version__}, {a.threads} thread(s), medians of {a.rounds} rounds, load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs\n")
    print("| base | rows | drop s | keep s | drop / keep | row-steps run | eval FLOPs drop / keep | scores equal |")
    print("|---|---|---|---|---|---|---|---|")
    ratios, secs = [], {}
    for size in a.sizes.split(","):
        ev, model = evaluator_for(grid, size)
        times: dict[bool, list[float]] = {True: [], False: []}
        res = {}
        for _ in range(a.rounds):
            for drop in (True, False):
                ev.drop_finished = drop
                t0 = time.perf_counter()
                res[drop] = ev.evaluate(model)
                times[drop].append(time.perf_counter() - t0)
        md, mk = statistics.median(times[True]), statistics.median(times[False])
        ratios.append(md / mk)
        secs[size] = (md, mk)
        rows = sum(r["n"] * (r.get("k") or 1) for r in res[True].rows if r["target"] != "pass@1")
        run = res[True].extra.get("row_steps_share", float("nan"))
        share = res[True].flops / max(1, res[False].flops)
        same = [r["per_problem"] for r in res[True].rows] == [r["per_problem"] for r in res[False].rows]
        print(f"| {size} | {rows} | {md:.2f} | {mk:.2f} | {md / mk:.2f}x | {run:.2f} | {share:.2f} | {same} |", flush=True)
    cells = {s: 0 for s in secs}
    for c in plan.runnable:
        if c.cell.config.model in cells:
            cells[c.cell.config.model] += 1
    new = sum(secs[s][0] * (1 + cells[s]) for s in secs)  # one shared step-0 per base + one end evaluation per cell
    old = sum(secs[s][1] * 2 * cells[s] for s in secs)  # step 0 and end in every cell, rows kept
    print(f"\ndrop / keep per evaluation: median {statistics.median(ratios):.2f}x")
    print(f"demo evaluation seconds, both levers / neither ({sum(cells.values())} cells, 1 end evaluation each): "
          f"{new:.0f} s / {old:.0f} s = {new / old:.2f}")


if __name__ == "__main__":
    main()
