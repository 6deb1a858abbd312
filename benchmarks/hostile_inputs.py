"""Hostile-input timings: how long each rule verifier and reward model takes on the payloads
of ``tests/rewards/test_hostile.py`` (the tests check the limits the code enforces; the
seconds live here, where a slow machine cannot fail a test).

    .venv/bin/python benchmarks/hostile_inputs.py [--rounds 5] [--rms prm:prm-xs,orm:orm-xs]

Per reward spec and payload: the median seconds of one ``score`` call over ``--rounds``
rounds (the first call of each spec, which pays math-verify's and sympy's set-up, is
excluded), and the slowest payload with its time beside the enforced limit (math-verify's
timer ``MATH_TIMEOUT_S`` per answer; the rule parser reads ``MAX_CHARS`` characters).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "rewards"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rms", default="", help="reward-model specs to time too, e.g. prm:prm-xs (packaged)")
    args = ap.parse_args()

    from test_hostile import RULES, payloads  # the tests' payloads, one definition

    from race.rewards import make_reward
    from race.rewards.mathverify import MATH_TIMEOUT_S
    from race.tasks import TextProblem, make_problem
    from race.tasks.verify import MAX_CHARS

    arith = make_problem([20, 22], ["+"])
    text = TextProblem(id="t", prompt="Q:What is 6*7?\nA:", answer="42", question="What is 6*7?",
                       solution="6*7=42 #### 42")
    specs = [(s, k) for s, k in RULES] + [(s, "text") for s in args.rms.split(",") if s]
    print(f"limits: math-verify timer {MATH_TIMEOUT_S} s per answer; rule parser reads {MAX_CHARS} chars")
    print(f"{'spec':28s} {'problem':7s} {'median s (all payloads)':>24s} {'slowest payload':>18s} {'its s':>8s}")
    with tempfile.TemporaryDirectory() as tmp:
        loads = payloads(Path(tmp))
        for spec, kind in specs:
            reward = make_reward(spec, device="cpu") if ":" in spec and spec.split(":")[0] in ("prm", "orm") \
                else make_reward(spec)
            problem = arith if kind == "arith" else text
            reward.score([problem], ["warm-up"])
            per: dict[str, float] = {}
            for name, payload in loads.items():
                secs = []
                for _ in range(args.rounds):
                    t0 = time.perf_counter()
                    reward.score([problem], [payload])
                    secs.append(time.perf_counter() - t0)
                per[name] = statistics.median(secs)
            worst = max(per, key=per.get)
            print(f"{spec:28s} {kind:7s} {statistics.median(per.values()):24.5f} {worst:>18s} {per[worst]:8.4f}")


if __name__ == "__main__":
    main()
