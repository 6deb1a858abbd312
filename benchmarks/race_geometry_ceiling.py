"""The noise-free reference over schedule geometries: for each (eta, keep_last, last) the racing
schedule sized by the grid and the cap (``race.spec.rungs.choose_schedule``, the step floors
included), every cut ranked by the allocations' true scores at their rung budgets, the pick the
true best at the last rung (``race_designs.ceiling_design``). It says which geometries could keep
the eventual winner alive if measurement were perfect: where no geometry does, the misses are
crossovers after a cut, not noise, and no ranking by measured score fixes them under that cap.

    python benchmarks/race_geometry_ceiling.py --generator tune --k 12 --first 100000 --worlds 100

Run it on tuning seeds only (it ranks geometries). Prints every geometry of the grid, best
winner-alive first; geometries whose schedule does not fit the cap in some world are listed
with the share of worlds that fit and left out of the ordering.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from race_designs import ceiling_design, make_world  # noqa: E402

ETAS = (2.0, 3.0, 4.0)
KEEP_LAST = (2, 3, 4)
LASTS = (1 / 5, 1 / 4, 1 / 3)


def geometry_rows(worlds: list, etas=ETAS, keep_last=KEEP_LAST, lasts=LASTS, cap: float = 0.9) -> list[dict]:
    """One row per geometry over ``worlds`` (learning worlds): winner alive, mean regret at T, the
    share of worlds whose schedule fits the cap."""
    from race.analysis.synthetic_race import allocation_names

    truth = [np.array([w.truth(i) for i in range(len(w.allocations))]) for w in worlds]
    names = [allocation_names(w) for w in worlds]
    rows = []
    for eta, kl, last in itertools.product(etas, keep_last, lasts):
        alive, reg, fits = [], [], []
        for w, t, n in zip(worlds, truth, names):
            d = ceiling_design(w, {"eta": eta, "keep_last": kl, "last": last, "max_unreused": cap})
            fits.append(bool(d["fits"]))
            alive.append(n[int(np.argmax(t))] in d["alive_last"])
            reg.append(float(t.max() - t[n.index(d["pick"])]))
        f = np.array(fits)
        rows.append({"eta": eta, "keep_last": kl, "last": last, "fits": float(f.mean()),
                     "alive": float(np.mean(np.array(alive)[f])) if f.any() else float("nan"),
                     "regret": float(np.mean(np.array(reg)[f])) if f.any() else float("nan")})
    return rows


def flat_regret(worlds: list) -> float:
    """The flat grid's mean regret at T on ``worlds`` (``race.analysis.designs.flat``: noisy, its
    observed winner at the largest pilot), the naive pick the geometries are read against."""
    from race.analysis.designs import flat
    from race.analysis.racing import RacingRule
    from race.analysis.synthetic_race import WorldSource

    out = []
    for w in worlds:
        src = WorldSource(w)
        t = np.array([w.truth(i) for i in range(len(w.allocations))])
        out.append(float(t.max() - t[src.names.index(flat(src, RacingRule(), 1).pick)]))
    return float(np.mean(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--generator", default="tune")
    ap.add_argument("--k", type=int, default=12)
    ap.add_argument("--first", type=int, default=100000)
    ap.add_argument("--worlds", type=int, default=100)
    ap.add_argument("--cap", type=float, default=0.9)
    ap.add_argument("--etas", default=",".join(f"{e:g}" for e in ETAS), help="comma-separated eta values")
    ap.add_argument("--keep-last", default=",".join(map(str, KEEP_LAST)), help="comma-separated keep_last values")
    ap.add_argument("--lasts", default="5,4,3", help="last rungs as divisors of T (T/5, T/4, T/3)")
    args = ap.parse_args()
    etas = tuple(float(x) for x in args.etas.split(","))
    keep_last = tuple(int(x) for x in args.keep_last.split(","))
    lasts = tuple(1 / float(x) for x in args.lasts.split(","))
    t0 = time.time()
    worlds = [w for w in (make_world(args.generator, s, 0.0, args.k) for s in range(args.first, args.first + args.worlds))
              if not w.tags.get("flat")]
    rows = geometry_rows(worlds, etas, keep_last, lasts, cap=args.cap)
    print(f"# command: python benchmarks/race_geometry_ceiling.py --generator {args.generator} --k {args.k} "
          f"--first {args.first} --worlds {args.worlds} --cap {args.cap:g} --etas {args.etas} "
          f"--keep-last {args.keep_last} --lasts {args.lasts}")
    print(f"## {args.generator} generator, K={args.k}: {len(worlds)} learning worlds, unreused pilots <= {args.cap:g} T\n")
    print(f"the flat grid's observed winner (noisy) on these worlds: regret {flat_regret(worlds):.4f}\n")
    print("| eta | keep_last | last rung | worlds that fit | winner alive (noise-free) | regret at T (noise-free) |")
    print("|---:|---:|---:|---:|---:|---:|")
    full = [r for r in rows if r["fits"] == 1.0]
    for r in sorted(full, key=lambda r: (-r["alive"], r["regret"])) + [r for r in rows if r["fits"] < 1.0]:
        alive = f"{r['alive']:.1%}" if r["fits"] == 1.0 else "-"
        regret = f"{r['regret']:.4f}" if r["fits"] == 1.0 else "-"
        print(f"| {r['eta']:g} | {r['keep_last']} | T/{1 / r['last']:.0f} | {r['fits']:.0%} | {alive} | {regret} |")
    print(f"\nwall time: {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
