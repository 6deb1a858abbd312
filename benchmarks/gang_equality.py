"""How far gang members' results are from their solo runs (float rounding of batched matmuls).

    .venv/bin/python benchmarks/gang_equality.py [--model tiny-s] [--budget 3e10] [--members 4]

Trains ``--members`` LoRA cells of one base (group sizes 4 and 8, seeds 0, 1, ...) alone
with the built-in engine, then together as one gang (``race.engines.gang``), and prints
per member: whether the ledgers are equal key by key (seconds aside), how many training
rows differ and the largest relative loss difference, the evaluation scores solo vs gang,
and how many evaluated problems (greedy, pass@k samples) come out differently.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _lines(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text().splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-s")
    ap.add_argument("--budget", type=float, default=3e10)
    ap.add_argument("--members", type=int, default=4)
    a = ap.parse_args()
    import transformers

    from race.engines import run_engine
    from race.engines.gang import run_gang
    from race.spec.run import run_config_from_dict

    transformers.utils.logging.disable_progress_bar()
    cfgs = [run_config_from_dict(dict(model=a.model, budget_flops=a.budget, prompts_per_step=4,
                                      num_generations=(4, 8)[i % 2], seed=i // 2, max_completion_length=40,
                                      reward="rule:partial", learning_rate=1e-4, lora={"r": 16, "lora_alpha": 16},
                                      eval={"n_problems": 200, "n_pass_problems": 50, "n_hard_problems": 50,
                                            "num_points": 2}, torch_threads=1))
            for i in range(a.members)]
    print(f"$ {' '.join([Path(sys.executable).name] + sys.argv)}")
    print(f"{a.members} members of {a.model}, budget {a.budget:.3g}, load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}\n")
    with tempfile.TemporaryDirectory() as td:
        root = Path(td)
        t0 = time.perf_counter()
        solo = [run_engine(c, root / f"s{i}") for i, c in enumerate(cfgs)]
        t_solo = time.perf_counter() - t0
        t0 = time.perf_counter()
        gang = run_gang([(c, root / f"g{i}") for i, c in enumerate(cfgs)], root / "gang")
        t_gang = time.perf_counter() - t0
        print("| member | G | steps | ledger equal | train rows differing | max rel. loss diff | solo final | "
              "gang final | eval answers differing |")
        print("|---|---|---|---|---|---|---|---|---|")
        for i, (c, s, g) in enumerate(zip(cfgs, solo, gang)):
            strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
            led = strip(_lines(root / f"s{i}" / "ledger.jsonl")) == strip(_lines(root / f"g{i}" / "ledger.jsonl"))
            sm, gm = _lines(root / f"s{i}" / "metrics.jsonl"), _lines(root / f"g{i}" / "metrics.jsonl")
            st = [r for r in sm if r["kind"] == "train"]
            gt = [r for r in gm if r["kind"] == "train"]
            differ = sum(1 for x, y in zip(st, gt) if x != y) + abs(len(st) - len(gt))
            rel = max((abs(x["loss"] - y["loss"]) / max(abs(x["loss"]), 1e-12) for x, y in zip(st, gt)
                       if "loss" in x and "loss" in y), default=0.0)
            se = [r for r in sm if r["kind"] == "eval"]
            ge = [r for r in gm if r["kind"] == "eval"]
            flips = sum(sum(1 for p, q in zip(x.get("per_problem") or [], y.get("per_problem") or []) if p != q)
                        for x, y in zip(se, ge))
            total = sum(len(x.get("per_problem") or []) for x in se)
            fmt = lambda d: ", ".join(f"{k} {v:.3f}" for k, v in d.items())  # noqa: E731
            print(f"| {i} | {c.num_generations} | {s['steps']}/{g['steps']} | {led} | {differ} of {len(st)} | "
                  f"{rel:.1e} | {fmt(s['final'])} | {fmt(g['final'])} | {flips} of {total} |")
        print(f"\nwall: solo runs one after another {t_solo:.1f} s, the gang {t_gang:.1f} s "
              f"({t_solo / t_gang:.2f}x; setup and evaluation included, one run each: not a speed benchmark)")


if __name__ == "__main__":
    main()
