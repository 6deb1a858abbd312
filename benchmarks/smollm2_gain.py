"""Did RL move the model? Paired greedy gains of a run and of its random-reward control.

    .venv/bin/python benchmarks/smollm2_gain.py RUN_DIR [CONTROL_DIR]

RUN_DIR: a run of configs/smollm2-gain.yaml (``race train configs/smollm2-gain.yaml
--output-dir RUN_DIR``); CONTROL_DIR: the same file with ``--set reward=random``. Reads
each run's greedy evaluations (``metrics.jsonl``: per-problem outcomes on the same test
problems) and prints, as a Markdown table: the run's first -> last score, the control's,
and the run's gain minus the control's gain per problem (the difference in differences;
with one shared step-0 evaluation it is the run's last score minus the control's), each
with a 95% paired bootstrap interval over problems (``benchmarks/prefix_vs_short.py``'s
``paired_interval``; one seed). Below the table: each run's steps, counted FLOPs, the
seconds its ledger records, and the share of the last 10 steps' rollouts cut at
``max_completion_length`` with their mean completion length.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from prefix_vs_short import _evals, paired_interval  # noqa: E402


def _rows(run_dir: Path, kind: str) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("kind") == kind]


def gain_rows(run: dict[int, list[float]], control: dict[int, list[float]] | None) -> list[tuple]:
    """(label, before, after, mean gain, lo, hi, n) for the run's first -> last evaluation,
    the control's, and the run's gain minus the control's, per problem."""
    import numpy as np

    def first_last(ev):
        return np.asarray(ev[min(ev)], float), np.asarray(ev[max(ev)], float)

    r0, r1 = first_last(run)
    out = [("RL: first -> last", r0.mean(), r1.mean(), *paired_interval((r1 - r0)[None]), len(r0))]
    if control is not None:
        c0, c1 = first_last(control)
        if len(c0) != len(r0):
            raise SystemExit(f"the run has {len(r0)} evaluation problems, the control {len(c0)}: not paired")
        out.append(("control: first -> last", c0.mean(), c1.mean(), *paired_interval((c1 - c0)[None]), len(c0)))
        out.append(("RL gain - control gain", c1.mean(), r1.mean(),
                    *paired_interval(((r1 - r0) - (c1 - c0))[None]), len(r0)))
    return out


def _facts(run_dir: Path) -> str:
    ledger = [json.loads(x) for x in (run_dir / "ledger.jsonl").read_text().splitlines()]
    trains = _rows(run_dir, "train")
    last = trains[-10:]
    counted = sum(r["flops"] for r in ledger if r.get("counted"))
    secs = sum(r["seconds"] for r in ledger)
    cut = sum(r["trunc_rate"] for r in last) / len(last)
    length = sum(r["completion_len"] for r in last) / len(last)
    return (f"{run_dir}: {trains[-1]['step']} steps, {counted:.3g} counted FLOPs, {secs:.0f} s in its ledger; "
            f"last 10 steps: {cut:.1%} of rollouts cut, mean completion {length:.1f} tokens")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("control", type=Path, nargs="?")
    a = ap.parse_args(argv)
    control = _evals(a.control) if a.control else None
    print("| comparison | before | after | gain | 95% paired interval | problems |")
    print("|---|---|---|---|---|---|")
    for label, before, after, mean, lo, hi, n in gain_rows(_evals(a.run), control):
        print(f"| {label} | {before:.3f} | {after:.3f} | {mean:+.3f} | [{lo:+.3f}, {hi:+.3f}] | {n} |")
    print()
    for d in [a.run] + ([a.control] if a.control else []):
        print(_facts(d))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
