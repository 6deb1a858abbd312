"""Grid throughput: cells per hour with 1 worker, with the chosen local layout, and on Ray;
or (``--gang``) the chosen local layout with every cell alone against the same cells in gangs.

Runs the same cells once per layout (1 worker x 1 thread; 1 worker x all threads; the
chosen local layout; Ray with that layout) into fresh study directories and prints them
side by side, with scaling efficiency = (cells/hour / cells/hour of 1x1) / cores used. Wall
time includes starting the workers (process pool or Ray), as a user would see it.

``--gang``: the cells are whole gangs of the grid (``race.grid.gangs``: ``--cells`` cells
or more, every ``--stride``-th gang), run with the chosen local layout twice, alone
(``gang: false``) and in their gangs (``gang: true``), ``--repeats`` times alternating; the
table adds the aggregate FLOP/s (the cells' ledger totals over the wall time) as a share
of workers x the one-thread matmul peak (measured before each run at tiny-m's MLP shape).

    python benchmarks/grid_throughput.py                       # configs/grid-demo.yaml, 4 cells
    python benchmarks/grid_throughput.py src/race/configs/demo.yaml --cells 8 --stride 3  # default grid
    python benchmarks/grid_throughput.py GRID.yaml --cells 8 --workers 2 --threads 1
    python benchmarks/grid_throughput.py --cell-fn tests/grid/fake_engine.py:run_engine --sleep 0.05
    python benchmarks/grid_throughput.py src/race/configs/demo.yaml --gang --cells 16 --stride 3  # gangs vs solo
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _measure(spec, cells: list[str], study_dir: Path, **runner) -> tuple[float, int, int]:
    from race.grid import run_grid

    t0 = time.perf_counter()
    res = run_grid(spec, study_dir, only=cells, poll_s=0.1, **runner)
    return time.perf_counter() - t0, res.complete, len(res.failed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("grid", nargs="?", default=str(ROOT / "configs" / "grid-demo.yaml"))
    ap.add_argument("--cells", type=int, default=4, help="first N runnable cells of the grid (cheapest budget first)")
    ap.add_argument("--stride", type=int, default=1, help="take every k-th runnable cell (mixes sizes and axes)")
    ap.add_argument("--workers", type=int, default=None, help="local layout: workers (default: the grid file's)")
    ap.add_argument("--threads", type=int, default=None, help="threads per worker (default: the grid file's)")
    ap.add_argument("--cell-fn", default=None, help="override the grid's cell function (e.g. the fake engine)")
    ap.add_argument("--sleep", type=float, default=None, help="RACE_FAKE_STEP_SLEEP for the fake engine")
    ap.add_argument("--no-ray", action="store_true", help="skip the Ray column")
    ap.add_argument("--no-wide", action="store_true", help="skip the 1 worker x all threads column")
    ap.add_argument("--keep", action="store_true", help="keep the study directories")
    ap.add_argument("--gang", action="store_true", help="the local layout alone vs in gangs, on whole gangs' cells")
    ap.add_argument("--repeats", type=int, default=1, help="--gang: alternating solo/gang runs of the cells")
    args = ap.parse_args(argv)
    if args.gang:
        return gang_main(args)

    from race.grid import grid_spec_from_dict, load_grid_spec, plan_grid

    spec = load_grid_spec(args.grid)
    if args.cell_fn:
        spec = grid_spec_from_dict({**spec.model_dump(), "cell_fn": args.cell_fn, "min_steps": 0}, source=args.grid,
                                   base_dir=Path(args.grid).resolve().parent)
    if args.sleep is not None:
        os.environ["RACE_FAKE_STEP_SLEEP"] = str(args.sleep)
    workers = args.workers or spec.runner.resolved_workers()
    threads = args.threads or spec.runner.threads_per_worker
    cells = [c.cell.run_id for c in plan_grid(spec).runnable][:: args.stride][: args.cells]
    if not cells:
        print("no runnable cells in the grid")
        return 1

    layouts = [("local 1x1", dict(runner="local", workers=1, threads_per_worker=1), 1)]
    if workers * threads > 1 and not args.no_wide:
        layouts.append((f"local 1x{workers * threads}",
                        dict(runner="local", workers=1, threads_per_worker=workers * threads), workers * threads))
    if workers > 1 or threads > 1:
        layouts.append((f"local {workers}x{threads}", dict(runner="local", workers=workers, threads_per_worker=threads),
                        workers * threads))
    if not args.no_ray:
        layouts.append((f"ray {workers}x{threads}", dict(runner="ray", workers=workers, threads_per_worker=threads),
                        workers * threads))

    tmp = Path(tempfile.mkdtemp(prefix="race-grid-bench-"))
    rows = []
    try:
        for name, runner, w in layouts:
            print(f"running {len(cells)} cells: {name} ...", flush=True)
            secs, done, failed = _measure(spec, cells, tmp / name.replace(" ", "_"), **runner)
            rows.append((name, w, secs, done, failed))
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"study directories kept under {tmp}")

    base_cph = len(cells) / rows[0][2] * 3600
    print()
    print(f"grid {spec.study} ({args.grid}), {len(cells)} cells, cell_fn {spec.cell_fn}, {os.cpu_count()} CPUs")
    print(f"{'layout':<14}{'cores':>6}{'wall s':>9}{'cells/h':>9}{'speedup':>9}{'efficiency':>12}{'failed':>8}")
    for name, cores, secs, done, failed in rows:
        cph = len(cells) / secs * 3600
        print(f"{name:<14}{cores:>6}{secs:>9.1f}{cph:>9.0f}{cph / base_cph:>9.2f}{cph / base_cph / cores:>12.0%}{failed:>8}")
    print("layout = workers x torch threads each; speedup vs local 1x1; efficiency = speedup / cores")
    return 0


def _ledger_flops(study_dir: Path) -> int:
    import json

    return sum(int(json.loads(p.read_text()).get("total_flops") or 0) for p in study_dir.glob("runs/*/run.json"))


def gang_main(args) -> int:
    """Solo vs gangs on the same cells (whole gangs), the chosen local layout, alternating."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from engine_profile import matmul_peak

    from race.grid import grid_spec_from_dict, load_grid_spec, plan_grid
    from race.grid.gangs import gang_units
    from race.models.family import TINY_FAMILY

    spec = load_grid_spec(args.grid)
    base = spec.model_dump()
    workers = args.workers or spec.runner.resolved_workers()
    threads = args.threads or spec.runner.threads_per_worker
    units = gang_units([pc.cell for pc in plan_grid(spec).runnable], gang=True, gang_size=spec.gang_size)
    cells: list[str] = []
    taken = 0
    for u in units[:: args.stride]:
        if len(cells) >= args.cells:
            break
        cells += [c.run_id for c in u]
        taken += 1
    specs = {g: grid_spec_from_dict({**base, "gang": g}, source=args.grid, base_dir=Path(args.grid).resolve().parent)
             for g in (False, True)}
    tm = TINY_FAMILY["tiny-m"]
    print(f"$ {' '.join([Path(sys.executable).name] + sys.argv)}")
    print(f"grid {spec.study}: {len(cells)} cells in {taken} gang(s), "
          f"local {workers}x{threads}, {args.repeats} round(s) alternating, load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="race-grid-gang-"))
    rows: dict[bool, list[tuple[float, int, int, float, float]]] = {False: [], True: []}
    try:
        for r in range(args.repeats):
            for g in (False, True):
                import torch

                torch.set_num_threads(1)
                peak = matmul_peak(2048, tm["hidden_size"], tm["intermediate_size"], repeats=5)
                d = tmp / f"{'gang' if g else 'solo'}{r}"
                print(f"running {len(cells)} cells {'in gangs' if g else 'alone'} ...", flush=True)
                secs, done, failed = _measure(specs[g], cells, d, runner="local", workers=workers,
                                              threads_per_worker=threads)
                rows[g].append((secs, done, failed, _ledger_flops(d) / secs, peak))
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"study directories kept under {tmp}")
    import statistics

    print(f"\n{'mode':<8}{'wall s':>9}{'cells/h':>9}{'GFLOP/s':>9}{'% peak':>8}{'failed':>8}  (medians over rounds)")
    cph = {}
    for g, rs in rows.items():
        secs = statistics.median(x[0] for x in rs)
        fl = statistics.median(x[3] for x in rs)
        pk = statistics.median(x[4] for x in rs)
        cph[g] = len(cells) / secs * 3600
        print(f"{'gangs' if g else 'solo':<8}{secs:>9.1f}{cph[g]:>9.0f}{fl / 1e9:>9.2f}{100 * fl / (workers * threads * pk):>7.1f}%"
              f"{sum(x[2] for x in rs):>8}")
    print(f"gangs / solo cells per hour: {cph[True] / cph[False]:.2f}x; % peak = aggregate ledger FLOP/s over "
          f"workers x threads x the one-thread matmul peak at tiny-m's MLP shape")
    return 0


if __name__ == "__main__":
    sys.exit(main())
